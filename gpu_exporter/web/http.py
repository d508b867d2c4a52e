"""HTTP/1.1 on the wire: a request head read, and an answer's head written (RFC 9112).

Pure functions over bytes, so that every rule about what a request may look like is in one place
and testable without a socket.  Anything malformed raises ``BadRequest`` with the status to answer;
the server then answers it and closes the connection.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from typing import NamedTuple

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 429: "Too Many Requests",
           431: "Request Header Fields Too Large",
           501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}  # fmt: skip
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
MAX_BODY = 64 * 1024  # a body is read and dropped; beyond this, 413
# Headers whose repetition makes a request ambiguous (request smuggling, RFC 9112 6.3).
_SINGLE = frozenset({"content-length", "transfer-encoding", "host", "authorization"})
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(): "²" is a digit to it, and int() refuses it


class BadRequest(Exception):
    """A request that gets ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request(NamedTuple):
    method: str
    path: str  # without the query
    version: str  # HTTP/1.0 or HTTP/1.1
    headers: Mapping[str, str]  # names lower-cased


def parse_head(head: bytes, limit: int) -> Request:
    """The request in a head that ends with an empty line, or BadRequest."""
    if len(head) > limit:
        raise BadRequest(431, "request head too large")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not all(c in _TOKEN for c in parts[0]):
        raise BadRequest(400, "malformed request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    if not target.startswith("/") or any(c < 0x21 or c > 0x7E for c in parts[1]):
        raise BadRequest(400, "malformed request target")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or not all(c in _TOKEN for c in name):
            raise BadRequest(400, "malformed header")
        key = name.decode("latin-1").lower()
        if key in headers and key in _SINGLE:
            raise BadRequest(400, f"more than one {key} header")
        headers[key] = value.strip(b" \t").decode("latin-1")
    if version == "HTTP/1.1" and "host" not in headers:
        raise BadRequest(400, "missing host header")  # RFC 9112, 3.2: a server MUST answer 400
    return Request(method, target.split("?", 1)[0], version, headers)


def body_length(headers: Mapping[str, str]) -> int:
    """How many bytes of body follow the head (read and dropped), or BadRequest."""
    if "transfer-encoding" in headers:
        if "content-length" in headers:  # two framings: the classic smuggling (RFC 9112, 6.3)
            raise BadRequest(400, "both transfer-encoding and content-length")
        raise BadRequest(501, "transfer-encoding is not supported")
    length = headers.get("content-length")
    if length is None:
        return 0
    if _DIGITS.fullmatch(length) is None:
        raise BadRequest(400, "bad content-length")
    if int(length) > MAX_BODY:
        raise BadRequest(413, "request body too large")
    return int(length)


def keep_alive(request: Request) -> bool:
    """Whether the client asks to keep the connection open after this answer: ``Connection`` is a list
    of options (RFC 9110, 7.6.1), and ``close`` anywhere in it closes."""
    options = {o.strip().lower() for o in request.headers.get("connection", "").split(",")}
    if "close" in options:
        return False
    return request.version == "HTTP/1.1" or "keep-alive" in options


def response_head(status: int, content_type: str, length: int, *, close: bool, server: str,
                  headers: Mapping[str, str]) -> bytes:  # fmt: skip
    """The status line and headers of an answer, ending with the empty line."""
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        f"Server: {server}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
        f"Connection: {'close' if close else 'keep-alive'}",
    ]
    lines += (f"{k}: {v}" for k, v in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
