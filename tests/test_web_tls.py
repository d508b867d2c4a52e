"""exporter-toolkit's TLS keys, honoured on real connections: cipher suites and their order, curves,
client certificate names (``client_allowed_sans``), inline certificates and keys, versions, ALPN.

Each test writes the web config a Go exporter would read and judges what a client gets.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme

from gpu_exporter.web.server import HttpServer
from tests.timing import LATE_S
from tests.web_helpers import client_cert_pem, client_context, get, server, tls_client, tls_files

OK = b"HTTP/1.1 200 OK"


@contextmanager
def tls_server(tmp_path: Path, ca: trustme.CA, key_type: trustme.KeyType = trustme.KeyType.ECDSA,
               **tls: Any) -> Iterator[HttpServer]:  # fmt: skip
    crt, key = tls_files(tmp_path, ca, key_type=key_type)
    with server(tmp_path, {"tls_server_config": {"cert_file": str(crt), "key_file": str(key), **tls}}) as srv:
        yield srv


def client(ca: trustme.CA, *, ciphers: str | None = None, curve: str | None = None,
           version: ssl.TLSVersion | None = None, cert: tuple[bytes, bytes] | None = None,
           tmp_path: Path | None = None) -> ssl.SSLContext:  # fmt: skip
    ctx = client_context(ca)
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    if curve is not None:
        ctx.set_ecdh_curve(curve)
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if cert is not None:
        assert tmp_path is not None
        (tmp_path / "client").mkdir(exist_ok=True)
        (tmp_path / "client" / "client.pem").write_bytes(cert[0] + cert[1])
        ctx.load_cert_chain(tmp_path / "client" / "client.pem")
    return ctx


def refused_handshake(port: int, ctx: ssl.SSLContext) -> None:
    """The handshake fails: at once, or (TLS 1.3, where the client finishes first) before any answer."""
    try:
        answer = tls_client(port, ctx)[1]
    except (ssl.SSLError, ConnectionError):
        return
    assert answer == b"", answer[:80]


# -- cipher_suites and prefer_server_cipher_suites ------------------------------------------------------
GCM128, GCM256 = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"
OPENSSL_128, OPENSSL_256 = "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"


def test_cipher_suites_limit_what_tls_1_2_clients_get(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca, cipher_suites=[GCM128]) as srv:
        cipher, answer = tls_client(srv.port, client(ca, version=ssl.TLSVersion.TLSv1_2))
        assert cipher is not None and cipher[0] == OPENSSL_128 and answer.startswith(OK)
        refused_handshake(srv.port, client(ca, ciphers=OPENSSL_256, version=ssl.TLSVersion.TLSv1_2))
        # TLS 1.3 suites cannot be chosen, in Go as here: a TLS 1.3 client is served as before.
        cipher, answer = tls_client(srv.port, client(ca, version=ssl.TLSVersion.TLSv1_3))
        assert cipher is not None and cipher[1] == "TLSv1.3" and answer.startswith(OK)


@pytest.mark.parametrize(("prefer", "agreed"), [(True, OPENSSL_256), (False, OPENSSL_128), (None, OPENSSL_256)])
def test_prefer_server_cipher_suites_picks_whose_order_counts(
    tmp_path: Path, ca: trustme.CA, prefer: bool | None, agreed: str
) -> None:
    # The server lists 256 first, the client 128 first; exporter-toolkit's default is the server's order.
    extra: dict[str, Any] = {} if prefer is None else {"prefer_server_cipher_suites": prefer}
    with tls_server(tmp_path, ca, cipher_suites=[GCM256, GCM128], **extra) as srv:
        ctx = client(ca, ciphers=f"{OPENSSL_128}:{OPENSSL_256}", version=ssl.TLSVersion.TLSv1_2)
        cipher, answer = tls_client(srv.port, ctx)
        assert cipher is not None and cipher[0] == agreed and answer.startswith(OK)


def test_only_tls_1_3_suites_leave_tls_1_2_without_a_cipher_as_in_go(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca, cipher_suites=["TLS_AES_128_GCM_SHA256"]) as srv:
        refused_handshake(srv.port, client(ca, version=ssl.TLSVersion.TLSv1_2))
        assert tls_client(srv.port, client(ca))[1].startswith(OK)


# -- curve_preferences -----------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_one_curve_is_the_only_key_exchange(tmp_path: Path, ca: trustme.CA, version: ssl.TLSVersion) -> None:
    # An RSA certificate: in TLS 1.2 a client that knows only P-384 could not check a P-256 ECDSA one.
    with tls_server(tmp_path, ca, trustme.KeyType.RSA, curve_preferences=["CurveP384"]) as srv:
        assert tls_client(srv.port, client(ca, curve="secp384r1", version=version))[1].startswith(OK)
        refused_handshake(srv.port, client(ca, curve="prime256v1", version=version))
        refused_handshake(srv.port, client(ca, curve="X25519", version=version))


def test_several_curves_keep_opensslss_defaults_which_include_them(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca, curve_preferences=["CurveP256", "CurveP384", "CurveP521", "X25519"]) as srv:
        for curve in ("prime256v1", "secp384r1", "secp521r1", "X25519"):
            assert tls_client(srv.port, client(ca, curve=curve))[1].startswith(OK), curve
        assert any("curve_preferences lists 4 curves" in w for w in srv.web.current().warnings)


# -- client_allowed_sans -----------------------------------------------------------------------------------
@contextmanager
def mtls_server(tmp_path: Path, ca: trustme.CA, sans: list[str] | None,
                auth: str = "RequireAndVerifyClientCert") -> Iterator[HttpServer]:  # fmt: skip
    (tmp_path / "clients.pem").write_bytes(ca.cert_pem.bytes())
    extra: dict[str, Any] = {} if sans is None else {"client_allowed_sans": sans}
    with tls_server(tmp_path, ca, client_auth_type=auth, client_ca_file="clients.pem", **extra) as srv:
        yield srv


ALLOWED = ["scraper.example", "192.0.2.7", "2001:db8::7", "prom@example.org", "spiffe://example.org/prometheus"]


@pytest.mark.parametrize(
    ("identities", "uris"),
    [(("scraper.example",), ()), (("other.example", "192.0.2.7"), ()), (("2001:db8:0:0:0:0:0:7",), ()),
     (("prom@example.org",), ()), ((), ("spiffe://example.org/prometheus",))],
)  # fmt: skip
def test_a_client_certificate_with_an_allowed_name_is_served(
    tmp_path: Path, ca: trustme.CA, identities: tuple[str, ...], uris: tuple[str, ...]
) -> None:
    with mtls_server(tmp_path, ca, ALLOWED) as srv:
        ctx = client(ca, cert=client_cert_pem(ca, *identities, uris=uris), tmp_path=tmp_path)
        assert tls_client(srv.port, ctx)[1].startswith(OK)


@pytest.mark.parametrize(
    ("identities", "uris"),
    [(("other.example",), ()), (("192.0.2.8",), ()), (("SCRAPER.example",), ()), (("sub.scraper.example",), ()),
     (("other@example.org",), ()), ((), ("spiffe://example.org/other",))],
)  # fmt: skip
def test_a_client_certificate_without_an_allowed_name_is_closed_before_it_is_read(
    tmp_path: Path, ca: trustme.CA, identities: tuple[str, ...], uris: tuple[str, ...]
) -> None:
    with mtls_server(tmp_path, ca, ALLOWED) as srv:
        ctx = client(ca, cert=client_cert_pem(ca, *identities, uris=uris), tmp_path=tmp_path)
        try:
            _, answer = tls_client(srv.port, ctx, request=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        except (ssl.SSLError, ConnectionError):
            answer = b""  # TLS 1.2 may see the close during the handshake
        assert answer == b""
        assert srv.connections.counts.get("client_san_refused") == 1
        # A client with an allowed name is still served.
        good = client(ca, cert=client_cert_pem(ca, "scraper.example"), tmp_path=tmp_path)
        assert tls_client(srv.port, good)[1].startswith(OK)


def test_with_allowed_sans_a_client_without_a_certificate_is_refused(tmp_path: Path, ca: trustme.CA) -> None:
    with mtls_server(tmp_path, ca, ["scraper.example"], auth="VerifyClientCertIfGiven") as srv:
        try:
            answer = tls_client(srv.port, client(ca))[1]
        except (ssl.SSLError, ConnectionError):
            answer = b""
        assert answer == b"" and srv.connections.counts.get("client_san_refused") == 1


def test_without_allowed_sans_any_certificate_from_the_ca_is_served(tmp_path: Path, ca: trustme.CA) -> None:
    with mtls_server(tmp_path, ca, None) as srv:
        ctx = client(ca, cert=client_cert_pem(ca, "anyone.example"), tmp_path=tmp_path)
        assert tls_client(srv.port, ctx)[1].startswith(OK)


# -- inline cert, key and client_ca ---------------------------------------------------------------------------
def test_inline_certificate_key_and_client_ca(tmp_path: Path, ca: trustme.CA) -> None:
    leaf = ca.issue_cert("127.0.0.1")
    web = {"tls_server_config": {
        "cert": leaf.cert_chain_pems[0].bytes().decode(), "key": leaf.private_key_pem.bytes().decode(),
        "client_ca": ca.cert_pem.bytes().decode(), "client_auth_type": "RequireAndVerifyClientCert"}}  # fmt: skip
    fds_before = set(os.listdir("/proc/self/fd"))
    with server(tmp_path, web) as srv:
        ctx = client(ca, cert=client_cert_pem(ca, "anyone.example"), tmp_path=tmp_path)
        assert tls_client(srv.port, ctx)[1].startswith(OK)
        refused_handshake(srv.port, client(ca))  # the inline CA is in force: a certificate is required
        assert srv.web.current().files == (tmp_path / "web.yml",)  # nothing but the config to watch
        # The key went to OpenSSL through an anonymous in-memory file, closed since.
        left = [os.readlink(f"/proc/self/fd/{fd}") for fd in set(os.listdir("/proc/self/fd")) - fds_before
                if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
        assert not [target for target in left if "memfd" in target or "gpu-exporter" in target], left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client", "web.yml"]  # no key left on disk


# -- versions and ALPN -------------------------------------------------------------------------------------------
def test_min_version_tls10_is_served_from_tls_1_2(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca, min_version="TLS10") as srv:
        assert tls_client(srv.port, client(ca, version=ssl.TLSVersion.TLSv1_2))[1].startswith(OK)
        assert any("min_version TLS10 is raised to TLS12" in w for w in srv.web.current().warnings)


@pytest.mark.parametrize(("min_version", "max_version"), [("TLS13", "TLS13"), ("TLS12", "TLS12")])
def test_min_and_max_version(tmp_path: Path, ca: trustme.CA, min_version: str, max_version: str) -> None:
    only = ssl.TLSVersion.TLSv1_3 if max_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    other = ssl.TLSVersion.TLSv1_2 if only == ssl.TLSVersion.TLSv1_3 else ssl.TLSVersion.TLSv1_3
    with tls_server(tmp_path, ca, min_version=min_version, max_version=max_version) as srv:
        assert tls_client(srv.port, client(ca, version=only))[1].startswith(OK)
        refused_handshake(srv.port, client(ca, version=other))


def test_a_client_asking_for_http2_gets_http_1_1(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    web = {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}, "http_server_config": {"http2": True}}
    with server(tmp_path, web) as srv:
        ctx = client_context(ca)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", srv.port)) as plain,
            ctx.wrap_socket(plain, server_hostname="127.0.0.1") as s,
        ):
            assert s.selected_alpn_protocol() == "http/1.1"
        assert get(srv.port, "/healthz", context=client_context(ca))[0] == 200


# -- handshake slots, as the table gives them ------------------------------------------------------------------
def client_hello(ca: trustme.CA) -> bytes:
    """The first flight of a real TLS client, which then goes quiet."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(ca).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@contextmanager
def small_server(tmp_path: Path, ca: trustme.CA, **kw: Any) -> Iterator[HttpServer]:
    crt, key = tls_files(tmp_path, ca)
    with server(tmp_path, {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}, **kw) as srv:
        yield srv


def test_a_handshake_gives_its_slot_back_when_it_ends(tmp_path: Path, ca: trustme.CA) -> None:
    with small_server(tmp_path, ca, max_handshakes=1) as srv:
        for _ in range(3):  # one slot: each handshake must free it for the next
            assert get(srv.port, "/healthz", context=client_context(ca), timeout=LATE_S)[0] == 200


def test_a_client_silent_in_its_handshake_is_cut_at_the_handshake_timeout(tmp_path: Path, ca: trustme.CA) -> None:
    with (
        small_server(tmp_path, ca, handshake_timeout=0.3, read_timeout=60.0) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s,
    ):
        s.sendall(client_hello(ca))
        data = b""
        while chunk := s.recv(65536):  # the server's first flight, then the close: long before the read timeout
            data += chunk
        assert data.startswith(b"\x16\x03")


def test_a_client_quiet_in_its_handshake_gives_the_only_slot_to_the_next(tmp_path: Path, ca: trustme.CA) -> None:
    with (
        small_server(tmp_path, ca, max_handshakes=1, handshake_timeout=30.0) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=20) as quiet,
    ):
        quiet.sendall(client_hello(ca))
        quiet.recv(65536)  # the server answered: the handshake holds the slot, and the client says no more
        assert get(srv.port, "/healthz", context=client_context(ca), timeout=20)[0] == 200
        assert srv.connections.counts.get("handshake_preempted") == 1


def test_a_client_that_finished_its_handshake_has_spoken(tmp_path: Path, ca: trustme.CA) -> None:
    with small_server(tmp_path, ca) as srv:
        ctx = client_context(ca)
        with (
            socket.create_connection(("127.0.0.1", srv.port)) as plain,
            ctx.wrap_socket(plain, server_hostname="127.0.0.1"),
        ):
            deadline = time.monotonic() + 10
            while [(c.state, c.spoke) for c in list(srv.connections._open)] != [("idle", True)]:
                assert time.monotonic() < deadline, [(c.state, c.spoke) for c in list(srv.connections._open)]
                time.sleep(0.01)
