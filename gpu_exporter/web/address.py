"""A listen address as Prometheus exporters take it: ``HOST:PORT``, ``:PORT`` or ``[v6]:PORT``.

Kept apart from the server, so that reading the settings imports neither asyncio nor ssl.
"""

from __future__ import annotations


def parse_listen_address(address: str) -> tuple[str, int]:
    """``(host, port)``; an empty host means every interface (``0.0.0.0``).  ValueError names the address."""
    host, sep, port = address.rpartition(":")
    # isascii: "²" and other Unicode digits pass isdigit() and then fail int().
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"listen address {address!r} must be HOST:PORT with a port from 0 to 65535 (0: any free port), e.g. :9445"
        )
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)
