"""TLS, mTLS and basic auth from the exporter-toolkit web config, and a server that survives bad clients."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing
import trustme
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.web.config import WebConfigError, load_web_config
from gpu_exporter.web.server import HttpServer
from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset
from tests.timing import LATE_S, NEVER_S
from tests.web_helpers import basic, client_context, get, hashed, raw, server, tls_files

pytestmark = pytest.mark.integration


# -- TLS and mTLS ---------------------------------------------------------------------------------------
def test_tls(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    with server(tmp_path, {"tls_server_config": {"cert_file": str(crt), "key_file": key.name}}) as srv:
        status, _, body = get(srv.port, context=client_context(ca))
        assert status == 200 and b"gpu_up" in body
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine)):
            get(srv.port)  # plain HTTP to a TLS port gets no answer
        old = ssl.create_default_context()
        ca.configure_trust(old)
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(srv.port, context=old)  # TLS 1.2 is the floor


def test_mtls_requires_a_client_certificate_from_the_ca(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    client_ca = trustme.CA()
    (tmp_path / "clients.pem").write_bytes(client_ca.cert_pem.bytes())
    tls = {"cert_file": str(crt), "key_file": str(key), "client_auth_type": "RequireAndVerifyClientCert",
           "client_ca_file": "clients.pem"}  # fmt: skip
    web = {"tls_server_config": tls}
    with server(tmp_path, web) as srv:
        good = client_ca.issue_cert("prometheus")
        assert get(srv.port, context=client_context(ca, good))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            get(srv.port, context=client_context(ca))  # no client certificate
        stranger = trustme.CA().issue_cert("mallory")
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            get(srv.port, context=client_context(ca, stranger))  # signed by another CA


def test_certificates_are_reloaded_without_a_restart(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    with server(tmp_path, {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}) as srv:
        assert get(srv.port, context=client_context(ca))[0] == 200
        other = trustme.CA()
        new_crt, new_key = tls_files(tmp_path, other, "next")
        crt.write_bytes(new_crt.read_bytes())
        key.write_bytes(new_key.read_bytes())

        def rotated() -> bool:
            try:
                return get(srv.port, context=client_context(other))[0] == 200
            except (ssl.SSLError, ConnectionError):
                return False

        wait_for(rotated, timeout=10, what="the new certificate in use")


# -- basic auth ---------------------------------------------------------------------------------------
def test_basic_auth_right_wrong_missing_and_probes(tmp_path: Path) -> None:
    web = {"basic_auth_users": {"prom": hashed("s3cret")},
           "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}  # fmt: skip
    with server(tmp_path, web) as srv:
        assert get(srv.port, headers=basic("prom", "s3cret"))[0] == 200
        for headers in ({}, basic("prom", "wrong"), basic("nobody", "s3cret"), {"Authorization": "Bearer x"},
                        {"Authorization": "Basic !!!"}):  # fmt: skip
            status, h, body = get(srv.port, headers=headers)
            assert status == 401 and h["WWW-Authenticate"].startswith('Basic realm="gpu-exporter"'), headers
            assert b"gpu_up" not in body
        assert get(srv.port, "/healthz")[0] == 200 and get(srv.port, "/readyz")[0] == 200  # kubelet probes
        assert get(srv.port, "/alerts")[0] == 401
        assert get(srv.port, headers=basic("prom", "s3cret"))[1]["X-Frame-Options"] == "deny"


def test_web_config_file_is_reloaded(tmp_path: Path) -> None:
    with server(tmp_path, {"basic_auth_users": {"prom": hashed("one")}}) as srv:
        assert get(srv.port, headers=basic("prom", "one"))[0] == 200
        (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed("two")}}))
        wait_for(lambda: get(srv.port, headers=basic("prom", "two"))[0] == 200, what="the new password")
        assert get(srv.port, headers=basic("prom", "one"))[0] == 401  # the old one, and its cache, are gone
        with structlog.testing.capture_logs() as logs:
            (tmp_path / "web.yml").write_text("basic_auth_users: [broken")  # a bad edit keeps the last good file
            # Each request asks for the config in force: once the watcher has tried the broken file
            # (it says so), the last good one must still be in force.
            wait_for(lambda: get(srv.port, headers=basic("prom", "two"))[0] == 200
                     and any(e["event"] == "web_config_reload_failed" for e in logs),
                     what="the watcher to try the broken file")  # fmt: skip
        assert get(srv.port, headers=basic("prom", "two"))[0] == 200
        assert get(srv.port, headers=basic("prom", "one"))[0] == 401


@pytest.mark.parametrize(
    ("web", "needle"),
    [
        ({"basic_auth_users": {"prom": "plaintext"}}, "must be a bcrypt hash"),
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "cannot load TLS certificate"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "max_version": "TLS11"}}, "max_version"),
        ({"basic_auth_userz": {}}, "basic_auth_userz: unknown key"),
        ({"http_server_config": {"headers": {"Content-Type": "x"}}}, "cannot be set"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequestClientCert"}},
         "client_auth_type"),
    ],
)  # fmt: skip
def test_a_broken_web_config_refuses_to_start_with_exit_2(tmp_path: Path, web: dict[str, object], needle: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(web))
    with pytest.raises(WebConfigError, match=needle.replace("(", r"\(")):
        load_web_config(path)
    cmd = [sys.executable, "-m", "gpu_exporter", "--simulate", "--web.config.file", str(path),
           "--web.listen-address", "127.0.0.1:0"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and needle.split(":")[0] in out.stderr and str(path) in out.stderr


def test_daemon_with_tls_and_auth(tmp_path: Path, ca: trustme.CA, scenario: Scenario) -> None:
    preset("pcie-degraded", scenario.path).write()
    crt, key = tls_files(tmp_path, ca)
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key)},
                                   "basic_auth_users": {"prom": hashed("pw")}}))  # fmt: skip
    with run_daemon(scenario.path, "--web.config.file", str(web), "--poll.interval", "200ms") as d:
        ctx = client_context(ca)
        wait_for(lambda: b"gpu_up{" in get(d.port, headers=basic("prom", "pw"), context=ctx)[2], what="first poll")
        assert get(d.port, context=ctx)[0] == 401
        assert get(d.port, "/readyz", context=ctx)[0] == 200


# -- bad clients ---------------------------------------------------------------------------------------
def test_malformed_requests_get_4xx_and_the_connection_closed(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        cases = {
            b"GARBAGE\r\n\r\n": b"400",
            b"GET /metrics HTTP/9.9\r\n\r\n": b"505",
            b"GET metrics HTTP/1.1\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n": b"501",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n": b"413",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n": b"405",
            b"GET /metrics HTTP/1.1\r\n\r\n": b"400",  # no Host (RFC 9112, 3.2)
            b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n": b"431",
        }
        for request, code in cases.items():
            answer = raw(srv.port, request)
            assert answer.startswith(b"HTTP/1.1 " + code), (request[:40], answer[:80])
            assert b"Traceback" not in answer


def test_request_bound_answers_503_beyond_it(tmp_path: Path) -> None:
    # Slow bcrypt checks (cost 12) keep requests in flight long enough to overlap; eight hosts, since
    # one host gets a single place in the password queue (429 beyond it).
    with server(tmp_path, {"basic_auth_users": {"prom": hashed("pw", rounds=12)}}, max_requests=2) as srv:
        results: list[int] = []

        def one(host: int) -> None:
            results.append(get(srv.port, headers=basic("prom", "wrong"), source=f"127.0.0.{10 + host}")[0])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(set(results)) == [401, 503] and results.count(401) >= 2
        assert get(srv.port, "/healthz")[0] == 200  # and it recovers


def test_slow_and_idle_clients_do_not_stop_a_scraper(tmp_path: Path) -> None:
    # Slowloris: heads that never finish, and connections that say nothing, held for as long as the
    # test lasts (no read or idle timeout of the server's ends them first; that they are cut off
    # at the read timeout is test_web_server's): a scraper is served beside them, within LATE_S.
    with server(tmp_path, read_timeout=NEVER_S, pressure_idle_timeout=NEVER_S) as srv:
        slow = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(100)]
        try:
            wait_for(lambda: len(srv.connections) == 300, what="the slow and idle clients accepted")
            for _ in range(5):
                t0 = time.monotonic()
                status, _, body = get(srv.port, timeout=LATE_S)
                assert status == 200 and b"gpu_up" in body and time.monotonic() - t0 < LATE_S
            assert len(srv.connections) >= 300  # all of them still held
        finally:
            for s in slow + idle:
                s.close()


@settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    st.one_of(
        st.binary(max_size=600),
        st.builds(
            lambda m, p, v, h: m + b" " + p + b" " + v + b"\r\n" + h + b"\r\n\r\n",
            st.sampled_from([b"GET", b"HEAD", b"POST", b"", b"G\x00T", b"OPTIONS"]),
            st.binary(max_size=80),
            st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"", b"http/1.1"]),
            st.binary(max_size=200),
        ),
    )
)
def test_fuzzed_requests_never_crash_or_leak(fuzz_server: HttpServer, data: bytes) -> None:
    answer = raw(fuzz_server.port, data, timeout=2)
    assert b"Traceback" not in answer and b"Error:" not in answer
    if answer:
        assert answer.startswith(b"HTTP/1.1 ")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    with server(tmp_path_factory.mktemp("fuzz"), {"basic_auth_users": {"prom": hashed("pw")}},
                read_timeout=0.5) as srv:  # fmt: skip
        yield srv
        assert get(srv.port, "/healthz")[0] == 200  # still serving after all of it


def test_process_churn_of_thousands_of_short_lived_pids(scenario: Scenario) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with run_daemon(s.path, "--poll.interval", "200ms") as d:
        for round_ in range(5):
            g = s.gpu(0)
            g.processes.clear()
            for i in range(1000):
                g.add_process(200_000 + round_ * 1000 + i, 1024**2, name=f"w{i}")
            s.write()
            wait_for(lambda r=round_: any(dict(ls).get("pid") == str(200_000 + r * 1000)
                                          for (n, ls) in d.metrics() if n == "gpu_process_memory_used_bytes"),
                     what="the new processes")  # fmt: skip
            metrics = d.metrics()
            pids = [ls for (n, ls) in metrics if n == "gpu_process_memory_used_bytes"]
            assert len(pids) == 20  # the default cap: cardinality stays bounded
            assert metrics[("gpu_processes", frozenset({("gpu", "0"), ("uuid", str(g.values["uuid"]))}))] == 1000


def test_the_kubernetes_tls_and_auth_example(tmp_path: Path, ca: trustme.CA) -> None:
    """deploy/k8s/examples/tls-auth renders, and its web.yml is accepted by the exporter."""
    root = Path(__file__).resolve().parent.parent
    example = root / "deploy" / "k8s" / "examples" / "tls-auth"
    kubectl = Path(sys.executable).parent / "kubectl"
    out = subprocess.run([str(kubectl), "kustomize", str(example)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout)}
    container = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert "--web.config.file=/etc/gpu-exporter/web/web.yml" in container["args"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    endpoint = docs["ServiceMonitor"]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and "basicAuth" in endpoint and "tlsConfig" in endpoint
    (tmp_path / "web.yml").write_text((example / "web.yml").read_text())
    tls_files(tmp_path, ca, "tls")
    config = load_web_config(tmp_path / "web.yml")
    assert config.tls is not None and set(config.users) == {"prometheus"}


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [
        ("gzip", True),
        ("GZIP", True),
        ("gzip;q=1.0", True),
        ("br, gzip;q=0.001", True),
        ("*", True),
        ("identity;q=1, *;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("identity, gzip;q=0", False),
        ("*;q=0.5, gzip;q=0", False),
        ("deflate", False),
        ("x-gzip-not", False),
        ("", False),
    ],
)
def test_gzip_only_where_accepted(tmp_path: Path, accept: str, gzipped: bool) -> None:
    with server(tmp_path) as srv:
        status, headers, body = get(srv.port, headers={"Accept-Encoding": accept})
        assert status == 200
        assert (headers.get("Content-Encoding") == "gzip") is gzipped, headers
        assert body.startswith(b"\x1f\x8b") is gzipped


def test_a_duplicate_content_length_is_refused(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        for lengths in ((b"0", b"0"), (b"0", b"5"), (b"5", b"0")):
            request = (b"GET /metrics HTTP/1.1\r\nContent-Length: " + lengths[0] + b"\r\nContent-Length: "
                       + lengths[1] + b"\r\n\r\nhello")  # fmt: skip
            answer = raw(srv.port, request)
            assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
            assert b"Connection: close" in answer


# -- duplicate and conflicting framing headers (request smuggling, auth confusion) ---------------------
def refused(answer: bytes) -> None:
    """A 400 that closes the connection, and nothing else: no 200, no second answer."""
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:120]
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert b"Connection: close" in answer.split(b"\r\n\r\n", 1)[0]
    assert b"gpu_up" not in answer


@pytest.mark.parametrize(
    "hosts",
    [(b"Host: a", b"Host: a"), (b"Host: a", b"Host: b"), (b"Host: a", b"host: b"), (b"HOST: a", b"hOsT: a")],
)
def test_two_host_headers_are_refused(tmp_path: Path, hosts: tuple[bytes, bytes]) -> None:
    with server(tmp_path) as srv:
        assert raw(srv.port, b"GET /metrics HTTP/1.1\r\n" + hosts[0] + b"\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 "
        )  # one of them alone is served
        refused(raw(srv.port, b"GET /metrics HTTP/1.1\r\n" + hosts[0] + b"\r\n" + hosts[1] + b"\r\n\r\n"))


@pytest.mark.parametrize("names", [(b"Authorization", b"Authorization"), (b"authorization", b"AUTHORIZATION")])
@pytest.mark.parametrize("valid_first", [True, False])
def test_two_authorization_headers_are_refused_whichever_comes_first(
    tmp_path: Path, names: tuple[bytes, bytes], valid_first: bool
) -> None:
    # The auth-confusion case: a proxy that checks one header and a server that reads the other.
    good = basic("prom", "pw")["Authorization"].encode()
    bad = basic("prom", "wrong")["Authorization"].encode()
    values = (good, bad) if valid_first else (bad, good)
    with server(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}) as srv:
        assert raw(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + names[0] + b": " + good
                   + b"\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200 ")  # fmt: skip
        for first, second in (values, (good, good)):
            request = (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + names[0] + b": " + first + b"\r\n" + names[1]
                       + b": " + second + b"\r\n\r\n")  # fmt: skip
            refused(raw(srv.port, request))


@pytest.mark.parametrize(
    "codings",
    [(b"chunked", b"chunked"), (b"identity", b"chunked"), (b"chunked", b"identity")],
)
@pytest.mark.parametrize(
    "names", [(b"Transfer-Encoding", b"Transfer-Encoding"), (b"Transfer-Encoding", b"transfer-ENCODING")]
)
def test_two_transfer_encoding_headers_are_refused(
    tmp_path: Path, codings: tuple[bytes, bytes], names: tuple[bytes, bytes]
) -> None:
    # A smuggled request in the body must not be answered either.
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    body = hex(len(smuggled))[2:].encode() + b"\r\n" + smuggled + b"\r\n0\r\n\r\n"
    with server(tmp_path) as srv:
        request = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + names[0] + b": " + codings[0] + b"\r\n" + names[1]
                   + b": " + codings[1] + b"\r\n\r\n" + body)  # fmt: skip
        refused(raw(srv.port, request))


@pytest.mark.parametrize("te_first", [True, False])
@pytest.mark.parametrize("length", [b"0", b"5", b"44"])
def test_transfer_encoding_with_content_length_is_refused(tmp_path: Path, te_first: bool, length: bytes) -> None:
    # CL.TE / TE.CL smuggling: one reader takes Content-Length, another the chunks, and the
    # smuggled request after the zero chunk (or inside the declared length) is read as the next one.
    te, cl = b"Transfer-Encoding: chunked\r\n", b"Content-Length: " + length + b"\r\n"
    headers = te + cl if te_first else cl + te
    request = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    with server(tmp_path) as srv:
        refused(raw(srv.port, request))
