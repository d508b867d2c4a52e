"""TLS on a Python whose asyncio the private adapter (gpu_exporter/web/tls.py) does not fit: the server
still starts, serves TLS through the public ``loop.start_tls``, and says so once.

Each test makes ``check_runtime`` fail as it would on such a Python and makes the private path
unusable, so a scrape that succeeds went through the public one.  Servers here listen on 127.0.0.1
in this process (the fast tier allows that, as for tests/test_web_tls.py).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trustme
from structlog.testing import capture_logs

from gpu_exporter.web import table as table_module
from gpu_exporter.web.connection import HANDSHAKE, Connection
from gpu_exporter.web.server import HttpServer
from gpu_exporter.web.tls import AdapterError, PublicHandshake
from tests.test_web_connections import Transport, feed, make_table, run
from tests.timing import NEVER_S, wait_until
from tests.web_helpers import basic, client_cert_pem, client_context, get, hashed, server, tls_client, tls_files

OK = b"HTTP/1.1 200 OK"
FOUND = "Python 3.99: asyncio.sslproto.SSLProtocol lacks the class attribute max_size"


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed() -> None:
        raise AdapterError(FOUND)

    def private_path(*args: object, **kwargs: object) -> None:
        raise AssertionError("the private SSLProtocol adapter was used")

    monkeypatch.setattr("gpu_exporter.web.server.check_runtime", changed)
    monkeypatch.setattr(table_module, "Handshake", private_path)


@contextmanager
def tls_server(tmp_path: Path, ca: trustme.CA, web: dict[str, Any] | None = None, **kw: Any) -> Iterator[HttpServer]:
    crt, key = tls_files(tmp_path, ca)
    config = {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}
    for name, value in (web or {}).items():  # tls_server_config entries merge, the rest is added
        if name == "tls_server_config":
            config["tls_server_config"].update(value)
        else:
            config[name] = value
    with server(tmp_path, config, **kw) as srv:
        yield srv


def client(ca: trustme.CA, tmp_path: Path, cert: tuple[bytes, bytes] | None = None) -> ssl.SSLContext:
    ctx = client_context(ca)
    if cert is not None:
        path = tmp_path / "client.pem"
        path.write_bytes(cert[0] + cert[1])
        ctx.load_cert_chain(path)
    return ctx


def closed_unanswered(port: int, ctx: ssl.SSLContext) -> bool:
    """The server ended the connection, in the handshake or before answering anything."""
    try:
        return tls_client(port, ctx, request=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=NEVER_S)[1] == b""
    except (ssl.SSLError, ConnectionError):
        return True


def closed_by_server(sock: socket.socket) -> bool:
    """The server closed a socket we never sent on (our own timeout raises instead)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.usefixtures("fallback")
def test_a_scrape_over_tls_is_served_through_the_public_api(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca) as srv:
        assert srv.connections.public_tls
        status, _, body = get(srv.port, "/metrics", context=client_context(ca))
        assert status == 200 and b"gpu_up{" in body
        # Keep-alive over the public TLS transport: a second request on the same connection.
        cipher, answer = tls_client(srv.port, client_context(ca))
        assert cipher is not None and answer.startswith(OK)


def test_the_fallback_is_said_once_at_start_with_the_python_and_what_the_check_found(
    tmp_path: Path, ca: trustme.CA, fallback: None
) -> None:
    with capture_logs() as logs, tls_server(tmp_path, ca) as srv:
        assert get(srv.port, "/healthz", context=client_context(ca))[0] == 200
    said = [e for e in logs if e["event"] == "tls_adapter_fallback"]
    assert len(said) == 1
    assert said[0]["log_level"] == "warning"
    assert said[0]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert FOUND in said[0]["found"] and said[0]["using"] == "loop.start_tls"
    assert "256 KiB" in said[0]["lost"] and "handshake_timeout" in said[0]["lost"]


def test_a_python_the_adapter_fits_keeps_the_private_path_and_says_nothing(tmp_path: Path, ca: trustme.CA) -> None:
    with capture_logs() as logs, tls_server(tmp_path, ca) as srv:
        assert not srv.connections.public_tls
        assert get(srv.port, "/healthz", context=client_context(ca))[0] == 200
    assert not [e for e in logs if e["event"] == "tls_adapter_fallback"]


@pytest.mark.usefixtures("fallback")
def test_mtls_refuses_a_client_without_a_certificate_and_reads_the_names_of_one_with_it(
    tmp_path: Path, ca: trustme.CA
) -> None:
    (tmp_path / "clients.pem").write_bytes(ca.cert_pem.bytes())
    web = {"tls_server_config": {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "clients.pem",
                                 "client_allowed_sans": ["scraper.example"]}}  # fmt: skip
    with tls_server(tmp_path, ca, web) as srv:
        assert closed_unanswered(srv.port, client(ca, tmp_path))
        assert "client_san_refused" not in srv.connections.counts  # refused by OpenSSL, in the handshake
        good = client(ca, tmp_path, client_cert_pem(ca, "scraper.example"))
        assert tls_client(srv.port, good)[1].startswith(OK)
        # The peer certificate reached the name check: one from the CA with another name is closed.
        assert closed_unanswered(srv.port, client(ca, tmp_path, client_cert_pem(ca, "other.example")))
        assert srv.connections.counts.get("client_san_refused") == 1
        assert tls_client(srv.port, good)[1].startswith(OK)


@pytest.mark.usefixtures("fallback")
def test_basic_auth_is_checked_over_the_public_tls_transport(tmp_path: Path, ca: trustme.CA) -> None:
    with tls_server(tmp_path, ca, {"basic_auth_users": {"prom": hashed("secret")}}) as srv:
        assert get(srv.port, "/metrics", context=client_context(ca))[0] == 401
        assert get(srv.port, "/metrics", basic("prom", "wrong"), context=client_context(ca))[0] == 401
        assert get(srv.port, "/metrics", basic("prom", "secret"), context=client_context(ca))[0] == 200


@pytest.mark.usefixtures("fallback")
def test_a_client_that_never_sends_a_handshake_is_cut_off_at_the_handshake_deadline(
    tmp_path: Path, ca: trustme.CA
) -> None:
    deadline = 1.0
    # Every other timeout is beyond the client's patience: only the handshake deadline can end it.
    with tls_server(tmp_path, ca, handshake_timeout=deadline, read_timeout=NEVER_S * 2, idle_timeout=NEVER_S * 2,
                    pressure_idle_timeout=NEVER_S * 2) as srv:  # fmt: skip
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=NEVER_S) as silent:
            assert closed_by_server(silent)
        waited = time.monotonic() - started
        assert waited >= deadline * 0.9  # not before the deadline (the client's clock started first)
        assert wait_until(lambda: srv.connections.counts.get("handshake_failed") == 1)
        assert wait_until(lambda: len(srv.connections) == 0)
        assert get(srv.port, "/healthz", context=client_context(ca))[0] == 200


@pytest.mark.usefixtures("fallback")
def test_a_silent_client_holding_the_only_handshake_slot_gives_it_up_to_a_scraper(
    tmp_path: Path, ca: trustme.CA
) -> None:
    """The handshake starts at accept here, so a silent client takes a slot at once; with a scraper
    waiting for it, the slot is taken back (the deadline is too far off to do it)."""
    with (
        tls_server(tmp_path, ca, max_handshakes=1, handshake_timeout=NEVER_S * 2, read_timeout=NEVER_S * 2) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=NEVER_S) as silent,
    ):
        assert wait_until(lambda: len(srv.connections._handshaking) == 1)
        assert tls_client(srv.port, client_context(ca), timeout=NEVER_S)[1].startswith(OK)
        assert srv.connections.counts.get("handshake_preempted") == 1
        assert closed_by_server(silent)


def test_a_tls_client_is_paused_at_connect_and_its_request_kept_while_start_tls_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is read before the handshake (start_tls reads the ClientHello itself), and a request
    that came with the handshake's last flight reaches the TLS layer before start_tls returns the
    transport: it is kept for the handler, and reading paused if it fills the buffer."""
    served: list[bytes] = []

    async def handler(conn: Connection) -> None:
        served.append(await conn.read_until(b"\r\n\r\n", 1))

    async def scene() -> None:
        table = make_table(handler, public_tls=True)
        asked: list[Connection] = []
        monkeypatch.setattr(table, "request_handshake", asked.append)
        tls = SimpleNamespace(admits=lambda cert: True)
        conn = Connection(table, tls)  # type: ignore[arg-type]
        raw = Transport(conn)
        conn.connection_made(raw)
        assert raw.events == ["pause"] and asked == [conn] and conn.early == b""
        conn.state = HANDSHAKE  # as the table leaves it when the handshake starts
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        feed(conn, request)  # handed on by the TLS layer, before start_tls has returned
        tls_transport = Transport(conn, extra={"peercert": None})
        conn.connection_made(tls_transport)
        await asyncio.sleep(0.01)
        assert served == [request] and tls_transport.events == []
        # A first read that fills the buffer pauses the TLS transport as soon as there is one.
        full = Connection(table, tls)  # type: ignore[arg-type]
        full.connection_made(Transport(full))
        full.state = HANDSHAKE
        feed(full, b"x" * table.limit)
        full_transport = Transport(full, extra={"peercert": None})
        full.connection_made(full_transport)
        assert full.buffered() == table.limit and full_transport.events == ["pause"]

    run(scene)


def test_a_public_handshake_cannot_be_given_bytes_already_read() -> None:
    """loop.start_tls reads the ClientHello itself: bytes read before would be lost, so none are taken."""

    async def scene() -> None:
        handshake = PublicHandshake(asyncio.Protocol(), None, ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER),  # type: ignore[arg-type]
                                    handshake_timeout=1, shutdown_timeout=1, done=lambda fut: None)  # fmt: skip
        with pytest.raises(ValueError, match="before anything is read"):
            handshake.start(b"\x16\x03\x01")

    asyncio.run(scene())


@pytest.mark.usefixtures("fallback")
def test_the_handshake_deadline_is_the_handshake_timeout_not_the_shutdown_grace(tmp_path: Path, ca: trustme.CA) -> None:
    """start_tls takes two deadlines: a client slower to start its handshake than the close grace (2 s),
    well within the handshake timeout, is served, not cut at the grace."""
    from gpu_exporter.web.connection import CLOSE_GRACE

    with tls_server(tmp_path, ca, handshake_timeout=NEVER_S) as srv, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=NEVER_S) as raw:  # fmt: skip
        time.sleep(CLOSE_GRACE + 0.5)  # the client thinks before its ClientHello
        with client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert tls.recv(65536).startswith(OK)
