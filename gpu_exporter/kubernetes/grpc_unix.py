"""One unary gRPC call over HTTP/2 on a unix socket, without grpcio.

The kubelet's pod-resources API is a single unary method on a local socket, asked every few
seconds.  grpcio's C core costs about 15 MiB of resident memory and a handful of threads for it;
this client is one blocking socket, the h2 library for HTTP/2 framing and HPACK, and the gRPC
wire protocol (a 5-byte length prefix per message, ``grpc-status`` in the trailers) by hand.

Each call opens its own connection and closes it: at one call every ten seconds that costs
nothing, and it leaves no channel state (reconnect backoff, half-dead connections after a kubelet
restart) between calls.  Everything a peer can do wrong ends as :class:`RpcError` with a gRPC
status name and a sentence saying what happened: no answer within the timeout
(``DEADLINE_EXCEEDED``), no socket or a dropped connection (``UNAVAILABLE``), an answer larger
than allowed (``RESOURCE_EXHAUSTED``), something that is not gRPC over HTTP/2 (``INTERNAL``), or
the server's own status.  Time is bounded by the deadline and memory by ``max_message_bytes``
however the peer behaves.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

__all__ = ["RpcError", "UnaryCall"]

# gRPC status codes by number (grpc/doc/statuscodes.md).
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# What a client makes of an HTTP status that came without a grpc-status (grpc/doc/http-grpc-status-mapping.md).
_HTTP_STATUS = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
                429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}  # fmt: skip
# RST_STREAM codes a client maps to a status of their own (grpc/doc/PROTOCOL-HTTP2.md); the rest are INTERNAL.
_RESET_STATUS: dict[int, str] = {
    h2.errors.ErrorCodes.REFUSED_STREAM: "UNAVAILABLE",
    h2.errors.ErrorCodes.CANCEL: "CANCELLED",
}
_STREAM = 1  # the only stream of the connection
_PREFIX_BYTES = 5  # compressed flag and big-endian length before each message
_RECV_BYTES = 64 * 1024
# HTTP/2 framing, headers and pings on top of the message; past this the peer is not answering a List.
_OVERHEAD_BYTES = 1024 * 1024
_MAX_HEADER_LIST_BYTES = 64 * 1024
_DIGITS = re.compile(r"[0-9]{1,9}")
_FRAME_HEADER_BYTES = 9
_SETTINGS = 0x4
_MAX_SETTINGS_BYTES = 6 * 64  # far more settings than HTTP/2 defines


class RpcError(Exception):
    """A call that did not return a message: ``code`` is a gRPC status name, ``details`` says why."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class UnaryCall:
    """Calls ``method`` (``/package.Service/Method``) once with a serialized request.

    ``run()`` blocks for at most ``timeout`` seconds and returns the serialized response;
    ``cancel()``, from any thread, ends a call in flight at once (``CANCELLED``) or stops one not yet
    started.  ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        socket_path: str,
        method: str,
        request: bytes = b"",
        *,
        timeout: float,
        max_message_bytes: int,
        user_agent: str = "gpu-exporter",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self.method = method
        self.request = request
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self.user_agent = user_agent
        self._clock = clock
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing to wake
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked in run()

    def run(self) -> bytes:
        deadline = self._clock() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                if self._cancelled:
                    raise RpcError("CANCELLED", "the call was cancelled before it started")
                self._sock = sock
            self._connect(sock, deadline)
            return self._exchange(sock, deadline)
        finally:
            with self._lock:
                self._sock = None
            sock.close()

    # -- the steps -------------------------------------------------------------------------------

    def _connect(self, sock: socket.socket, deadline: float) -> None:
        sock.settimeout(self._remaining(deadline, "connecting"))
        try:
            sock.connect(self.socket_path)
        except TimeoutError:
            raise self._timed_out("connecting") from None
        except OSError as e:
            raise self._unavailable(f"cannot connect to {self.socket_path}: {e.strerror or e}") from None

    def _exchange(self, sock: socket.socket, deadline: float) -> bytes:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        window = self.max_message_bytes + _PREFIX_BYTES
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: min(window, 2**31 - 1),
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST_BYTES,
            },
        )
        conn.initiate_connection()
        # The connection's window starts at 64 KiB whatever the settings say; open it to a whole answer.
        conn.increment_flow_control_window(min(window, 2**31 - 1 - 65535))
        timeout_ms = max(1, min(99_999_999, int(self._remaining(deadline, "sending") * 1000)))
        conn.send_headers(
            _STREAM,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", self.method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", f"{timeout_ms}m"),
                ("user-agent", self.user_agent),
            ],
        )
        conn.send_data(_STREAM, _frame(self.request), end_stream=True)
        # A failed write is not the end: a server that answers and closes at once (an error, a
        # GOAWAY, an HTTP/1 reply) has said why in what is left to read.
        send_failed = self._send(sock, conn, deadline)

        answer = _Answer()
        received = 0
        start = bytearray()  # the first frame header, until it is known to be HTTP/2
        limit = self.max_message_bytes + _PREFIX_BYTES + _OVERHEAD_BYTES
        while not answer.ended:
            sock.settimeout(self._remaining(deadline, "waiting for the answer"))
            try:
                chunk = sock.recv(_RECV_BYTES)
            except TimeoutError:
                raise self._timed_out("waiting for the answer") from None
            except OSError as e:
                raise self._unavailable(f"the connection failed: {e.strerror or e}") from None
            if not chunk:
                why = f" (writing to it failed: {send_failed})" if send_failed else ""
                raise self._unavailable(f"the server closed the connection before the answer was complete{why}")
            received += len(chunk)
            if received > limit:
                raise RpcError(
                    "RESOURCE_EXHAUSTED", f"the server sent {received} bytes and has not finished the answer"
                )
            if len(start) < _FRAME_HEADER_BYTES:
                start += chunk[: _FRAME_HEADER_BYTES - len(start)]
                if len(start) == _FRAME_HEADER_BYTES and not _is_settings_frame(start):
                    raise RpcError("INTERNAL", f"the server does not speak HTTP/2: it began with {chunk[:32]!r}")
            try:
                events = conn.receive_data(chunk)
            except h2.exceptions.H2Error as e:
                raise RpcError("INTERNAL", f"the answer is not valid HTTP/2 ({_describe(e)})") from None
            for event in events:
                answer.take(event, conn, self.max_message_bytes)
            if not answer.ended and not send_failed:  # window updates, ping and settings acks
                send_failed = self._send(sock, conn, deadline)
        return answer.message()

    def _send(self, sock: socket.socket, conn: h2.connection.H2Connection, deadline: float) -> str:
        """Writes what h2 has queued; returns why that failed ("" when it did not)."""
        data = conn.data_to_send()
        if not data:
            return ""
        sock.settimeout(self._remaining(deadline, "sending"))
        try:
            sock.sendall(data)
        except TimeoutError:
            raise self._timed_out("sending") from None
        except OSError as e:
            return str(e.strerror or e)
        return ""

    # -- errors ----------------------------------------------------------------------------------

    def _remaining(self, deadline: float, doing: str) -> float:
        left = deadline - self._clock()
        if left <= 0:
            raise self._timed_out(doing)
        return left

    def _timed_out(self, doing: str) -> RpcError:
        if self._cancelled:
            return RpcError("CANCELLED", "the call was cancelled")
        return RpcError("DEADLINE_EXCEEDED", f"no answer within {self.timeout:g} s ({doing})")

    def _unavailable(self, detail: str) -> RpcError:
        if self._cancelled:
            return RpcError("CANCELLED", "the call was cancelled")
        return RpcError("UNAVAILABLE", detail)


class _Answer:
    """What the server sent on the call's stream, judged as gRPC once the stream ends."""

    def __init__(self) -> None:
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] = {}
        self.body = bytearray()
        self.ended = False

    def take(self, event: h2.events.Event, conn: h2.connection.H2Connection, max_message_bytes: int) -> None:
        if self.ended:  # a GOAWAY or a reset read together with the whole answer changes nothing
            return
        if isinstance(event, h2.events.ResponseReceived):
            self.headers = _header_dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.body += event.data
            if len(self.body) > max_message_bytes + _PREFIX_BYTES:
                raise RpcError("RESOURCE_EXHAUSTED", f"the answer is larger than {max_message_bytes} bytes")
            if event.flow_controlled_length:
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            self.trailers = _header_dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            code = event.error_code
            status = _RESET_STATUS.get(code, "INTERNAL") if code is not None else "INTERNAL"
            raise RpcError(status, f"the server reset the call ({_code_name(code)})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            # Even a graceful GOAWAY that would still let this stream finish ends it here: h2 closes
            # the whole connection on it.  The call is lost, the next refresh connects afresh.
            detail = f"the server closed the connection before answering (GOAWAY {_code_name(event.error_code)})"
            raise RpcError("UNAVAILABLE", detail)

    def message(self) -> bytes:
        """The one response message, or RpcError with the server's status or what was wrong."""
        headers = self.headers or {}
        # A trailers-only answer (an error with no message) carries its status in the headers.
        status_from = self.trailers or headers
        http_status = headers.get(":status", "")
        if http_status != "200":
            code = _HTTP_STATUS.get(_number(http_status) or 0, "UNKNOWN")
            raise RpcError(code, f"the server answered HTTP {http_status or 'with no status'}, not gRPC")
        if not headers.get("content-type", "").startswith("application/grpc"):
            raise RpcError("UNKNOWN", f"the answer is {headers.get('content-type') or 'untyped'}, not application/grpc")
        status = status_from.get("grpc-status")
        if status is None:
            raise RpcError("INTERNAL", "the answer ended without a grpc-status")
        if status != "0":
            number = _number(status)
            code = STATUS_NAMES[number] if number is not None and number < len(STATUS_NAMES) else "UNKNOWN"
            details = urllib.parse.unquote(status_from.get("grpc-message", ""))
            raise RpcError(code, details or f"grpc-status {status}")
        return _unframe(bytes(self.body))


def _is_settings_frame(header: bytes | bytearray) -> bool:
    """Whether a frame header is a SETTINGS frame, which an HTTP/2 server must send first (RFC 9113 3.4).

    h2 waits for a whole frame before judging it, so an HTTP/1 reply ("HTTP/1.1 400", read as a
    4.7 MB frame) would otherwise hold the call until its deadline.
    """
    length = int.from_bytes(header[:3], "big")
    stream = int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF
    return header[3] == _SETTINGS and stream == 0 and length % 6 == 0 and length <= _MAX_SETTINGS_BYTES


def _number(text: str) -> int | None:
    return int(text) if _DIGITS.fullmatch(text) else None


def _frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _unframe(body: bytes) -> bytes:
    if len(body) < _PREFIX_BYTES:
        raise RpcError("INTERNAL", f"the answer holds {len(body)} bytes, not a message")
    if body[0] != 0:
        raise RpcError("INTERNAL", "the answer is compressed, which this client never asks for")
    size = int.from_bytes(body[1:_PREFIX_BYTES], "big")
    if len(body) != _PREFIX_BYTES + size:
        raise RpcError("INTERNAL", f"the message says {size} bytes and {len(body) - _PREFIX_BYTES} came")
    return body[_PREFIX_BYTES:]


def _header_dict(headers: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("ascii", "replace") if isinstance(name, bytes) else name
        out[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


def _code_name(code: int | h2.errors.ErrorCodes | None) -> str:
    return code.name if isinstance(code, h2.errors.ErrorCodes) else str(code)


def _describe(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."
