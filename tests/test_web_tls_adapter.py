"""The one adapter over asyncio's private ``SSLProtocol`` (gpu_exporter/web/tls.py), and the Pythons it
is known to work on.

The adapter subclasses a private class whose constructor has changed between CPython versions.  It
was checked by hand on 3.11, 3.12 and 3.13 (the constructor's parameters, ``max_size`` sizing the
read buffer, ``get_buffer``/``buffer_updated``, a real handshake through ``Handshake``).  On any
other version the first test here fails until someone checks it again and adds the version to
``KNOWN_PYTHONS``.  Where something the adapter uses is gone (``check_runtime``), the daemon
serves TLS through public asyncio API instead (tests/test_web_tls_fallback.py).
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import sys
from asyncio import sslproto
from pathlib import Path

import pytest
import trustme

from gpu_exporter.web import tls
from tests.web_helpers import client_context, get, server, tls_files


def test_this_python_is_one_the_tls_adapter_is_known_to_work_on() -> None:
    version = sys.version_info[:2]
    assert version in tls.KNOWN_PYTHONS, (
        f"gpu_exporter/web/tls.py subclasses asyncio.sslproto.SSLProtocol, a private class, and is known to "
        f"work on Python {', '.join(f'{a}.{b}' for a, b in tls.KNOWN_PYTHONS)}, not {version[0]}.{version[1]}. "
        "Check Lib/asyncio/sslproto.py of this version for what the module's docstring lists (the "
        "constructor's parameters, max_size sizing the read buffer, get_buffer/buffer_updated, the app "
        "protocol's connection_made after peercert is known), run tests/test_web_security.py and "
        "tests/test_web_hostile.py, then add the version to KNOWN_PYTHONS and to docs/deploying.md."
    )


def test_this_pythons_sslproto_has_what_the_adapter_uses() -> None:
    tls.check_runtime()  # raises, naming what is missing
    params = inspect.signature(sslproto.SSLProtocol.__init__).parameters
    assert {"ssl_handshake_timeout", "ssl_shutdown_timeout", "call_connection_made"} <= set(params)


def test_the_adapter_reads_through_a_16_kib_buffer() -> None:
    async def made() -> int:
        loop = asyncio.get_running_loop()
        proto = tls._Protocol(loop, asyncio.Protocol(), ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), loop.create_future(),
                              server_side=True)  # fmt: skip
        return len(proto.get_buffer(-1))  # the whole buffer, as asyncio's transport asks for it

    assert asyncio.run(made()) == tls.READ_BUFFER == 16 * 1024 < sslproto.SSLProtocol.max_size


def test_a_python_without_what_the_adapter_uses_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed:  # a future sslproto: another constructor, no max_size
        def __init__(self, loop: object, app_protocol: object, sslcontext: object, waiter: object) -> None:
            pass

        def get_buffer(self, n: int) -> None:
            pass

    monkeypatch.setattr(tls, "SSLProtocol", Changed)
    with pytest.raises(tls.AdapterError) as e:
        tls.check_runtime()
    text = str(e.value)
    for needle in ("'ssl_handshake_timeout'", "'ssl_shutdown_timeout'", "'server_side'", "max_size",
                   "buffer_updated()", "gpu_exporter/web/tls.py", "3.11, 3.12, 3.13"):  # fmt: skip
        assert needle in text, (needle, text)
    assert "get_buffer" not in text
    # The whole sentence an operator reads in the fallback's warning on such a Python.
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert text == (
        f"Python {here}: asyncio.sslproto.SSLProtocol lacks the constructor's 'server_side' parameter, the "
        "constructor's 'call_connection_made' parameter, the constructor's 'ssl_handshake_timeout' parameter, "
        "the constructor's 'ssl_shutdown_timeout' parameter, the class attribute max_size (its read buffer's "
        "size), the method buffer_updated(); gpu_exporter/web/tls.py must be adapted (known to work on 3.11, "
        "3.12, 3.13)"
    )


@pytest.mark.parametrize("max_size", [None, "256 KiB", 262144.0])
def test_a_read_buffer_size_that_is_not_a_whole_number_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                 max_size: object) -> None:  # fmt: skip
    """The adapter sets max_size to size asyncio's read buffer; a class where it is anything else
    than an int would not be sized by it."""
    changed = type("Changed", (sslproto.SSLProtocol,), {"max_size": max_size})
    monkeypatch.setattr(tls, "SSLProtocol", changed)
    with pytest.raises(tls.AdapterError, match=r"lacks the class attribute max_size \(its read buffer's size\);"):
        tls.check_runtime()


def test_a_python_with_everything_the_adapter_uses_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subclass that keeps the constructor, max_size and both buffer methods passes the check."""
    monkeypatch.setattr(tls, "SSLProtocol", type("Same", (sslproto.SSLProtocol,), {"max_size": 1024}))
    tls.check_runtime()


def test_a_handshake_through_the_adapter(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    with server(tmp_path, {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}) as srv:
        status, _, body = get(srv.port, "/healthz", context=client_context(ca))
        assert (status, body) == (200, b"ok\n")


def test_the_docs_state_the_pythons_it_runs_on() -> None:
    readme = (Path(__file__).resolve().parent.parent / "docs" / "deploying.md").read_text(encoding="utf-8")
    versions = [f"{a}.{b}" for a, b in tls.KNOWN_PYTHONS]
    assert f"It runs on CPython {', '.join(versions[:-1])} and {versions[-1]}" in readme


def test_bytes_already_read_reach_the_tls_layer_whole_in_buffer_sized_pieces() -> None:
    """A ClientHello read before the handshake started may be longer than one read buffer: every byte
    goes in, in order, in pieces no longer than the buffer the protocol offers."""

    class Collect(asyncio.BufferedProtocol):
        def __init__(self) -> None:
            self.got = bytearray()
            self.pieces: list[int] = []
            self._buf = bytearray(1000)

        def get_buffer(self, sizehint: int) -> bytearray:
            return self._buf

        def buffer_updated(self, nbytes: int) -> None:
            self.pieces.append(nbytes)
            self.got += self._buf[:nbytes]

    data = bytes(range(256)) * 10  # 2,560 bytes: three pieces
    proto = Collect()
    tls.feed(proto, data)
    assert bytes(proto.got) == data and proto.pieces == [1000, 1000, 560]


def test_a_constructor_whose_signature_cannot_be_read_is_named_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect cannot read every callable's signature: that is an AdapterError (the server falls back),
    not a TypeError that would stop it."""
    monkeypatch.setattr(tls, "SSLProtocol", type("Opaque", (sslproto.SSLProtocol,), {"__init__": 5}))
    with pytest.raises(tls.AdapterError, match=r"lacks the constructor's 'loop' parameter"):
        tls.check_runtime()
