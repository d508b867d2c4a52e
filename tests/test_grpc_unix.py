"""The exporter's own gRPC client, against grpcio's real server and against servers that misbehave.

A kubelet is a grpc-go server; grpcio's C-core server (the fake kubelet) is the reference
implementation of the same protocol.  The hostile servers below speak real HTTP/2 (the h2 library,
server side) or raw bytes on the unix socket, each doing one thing wrong.  Whatever they do, a call
ends within its timeout as an RpcError that names the problem, holds no more than its limit in
memory, and leaves no socket open.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from gpu_exporter.kubernetes.grpc_unix import RpcError, UnaryCall
from gpu_exporter.kubernetes.kubelet import LIST_METHOD, PodRef, PodResourcesWatcher
from gpu_exporter.kubernetes.podresources import decode_list_response
from tests.fake_kubelet import FakeKubelet, fake_kubelet, pod, socket_path_in
from tests.hypothesis_budget import examples
from tests.socket_helpers import serve_connections
from tests.timing import LATE_S, NEVER_S, wait_until

GPU = "nvidia.com/gpu"
MIB = 1024 * 1024


def call(path: Path, *, method: str = LIST_METHOD, timeout: float = LATE_S, max_bytes: int = 16 * MIB) -> bytes:
    return UnaryCall(str(path), method, timeout=timeout, max_message_bytes=max_bytes).run()


def failure(path: Path, **kwargs: object) -> RpcError:
    with pytest.raises(RpcError) as caught:
        call(path, **kwargs)  # type: ignore[arg-type]
    return caught.value


def timed_failure(path: Path, **kwargs: object) -> tuple[RpcError, float]:
    """The failure of a call, and how long it took to come."""
    t0 = time.monotonic()
    e = failure(path, **kwargs)
    return e, time.monotonic() - t0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- servers that misbehave ----------------------------------------------------------------------


class SocketServer:
    """Accepts connections on a unix socket and hands each to ``handler`` on its own thread."""

    def __init__(self, path: Path, handler: Callable[[socket.socket], object]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.handler = handler
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.stopped = threading.Event()
        self.connections = 0
        self.active = threading.Condition()  # guards _open: handlers still holding a connection
        self._open = 0
        self.acceptor = serve_connections(self.listener, self._serve, self.stopped)

    def _serve(self, conn: socket.socket) -> None:
        with self.active:
            self.connections += 1
            self._open += 1
        conn.settimeout(10)
        try:
            self.handler(conn)
        except Exception:  # the client gave up first: what most of these tests want
            pass
        finally:
            conn.close()
            with self.active:
                self._open -= 1
                self.active.notify_all()

    def close(self) -> None:
        self.stopped.set()
        self.acceptor.join(NEVER_S)
        self.listener.close()
        with self.active:  # every server-side socket closed before a test counts fds
            self.active.wait_for(lambda: self._open == 0, timeout=NEVER_S)
        self.path.unlink(missing_ok=True)


@contextmanager
def serving(
    tmp_path: Path, handler: Callable[[socket.socket], object], path: Path | None = None
) -> Iterator[SocketServer]:
    server = SocketServer(path or socket_path_in(tmp_path), handler)
    try:
        yield server
    finally:
        server.close()


class Reply:
    """The server side of one HTTP/2 connection, after the client's request has arrived whole."""

    def __init__(
        self, sock: socket.socket, conn: h2.connection.H2Connection, stream: int,
        request_headers: dict[str, str], request_body: bytes,
    ) -> None:  # fmt: skip
        self.sock, self.conn, self.stream = sock, conn, stream
        self.request_headers, self.request_body = request_headers, request_body

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def headers(self, headers: list[tuple[str, str]], *, end: bool = False) -> None:
        self.conn.send_headers(self.stream, headers, end_stream=end)
        self.flush()

    def grpc_headers(self) -> None:
        self.headers([(":status", "200"), ("content-type", "application/grpc")])

    def data(self, data: bytes, *, end: bool = False) -> None:
        self.conn.send_data(self.stream, data, end_stream=end)
        self.flush()

    def trailers(self, trailers: list[tuple[str, str]]) -> None:
        self.conn.send_headers(self.stream, trailers, end_stream=True)
        self.flush()

    def pump(self) -> None:
        """Reads what the client sent (window updates, ping acks), answering as HTTP/2 requires."""
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionResetError
        self.conn.receive_data(data)
        self.flush()


def discard(sock: socket.socket) -> None:
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def h2_server(respond: Callable[[Reply], None]) -> Callable[..., None]:
    def handle(sock: socket.socket, conn: h2.connection.H2Connection | None = None) -> None:
        if conn is None:  # else the caller has sent an opening of its own
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
        headers: dict[str, str] = {}
        body, stream, ended = bytearray(), 0, False
        while not ended:
            data = sock.recv(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    stream = event.stream_id
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                ended = ended or isinstance(event, h2.events.StreamEnded)
            sock.sendall(conn.data_to_send())
        respond(Reply(sock, conn, stream, headers, bytes(body)))

    return handle


def framed(message: bytes, *, compressed: bool = False, size: int | None = None) -> bytes:
    return bytes([compressed]) + (len(message) if size is None else size).to_bytes(4, "big") + message


def grpc_answer(body: bytes, trailers: list[tuple[str, str]]) -> Callable[[Reply], None]:
    def respond(r: Reply) -> None:
        r.grpc_headers()
        if body:
            r.data(body)
        r.trailers(trailers)

    return respond


OK = [("grpc-status", "0")]


def header_bomb(r: Reply) -> None:
    """A 70 KB header block, past the client's 64 KiB limit, as HEADERS and CONTINUATION frames.

    Encoded here without Huffman coding: hpack's pure-Python Huffman encoder takes a third of a second
    for this block on a quiet core and seconds on a busy one, time spent by the test server, not the
    client (which refuses the block in milliseconds)."""
    block = hpack.Encoder().encode([(":status", "200"), ("x-bomb", "y" * 70_000)], huffman=False)
    pieces = [block[i : i + 16384] for i in range(0, len(block), 16384)]  # HTTP/2's default frame size
    r.sock.sendall(
        b"".join(
            frame(0x1 if i == 0 else 0x9, r.stream, piece, flags=0x4 if i == len(pieces) - 1 else 0)
            for i, piece in enumerate(pieces)
        )
    )


# -- against grpcio's own server -----------------------------------------------------------------


def test_reads_the_answer_of_a_real_grpc_server(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a", "GPU-b"])), pod("kube", "q", ("c", GPU, ["MIG-1"]))]
        pods = decode_list_response(call(kubelet.socket_path))
    assert [(p.namespace, p.name, [d.device_ids for c in p.containers for d in c.devices]) for p in pods] == [
        ("ns", "p", [("GPU-a", "GPU-b")]),
        ("kube", "q", [("MIG-1",)]),
    ]


def big_node(kubelet: FakeKubelet, pods: int) -> None:
    """``pods`` pods with long device ids: about 1 KiB of answer each."""
    kubelet.pods = [pod("ns", f"p{i}", ("main", GPU, [f"GPU-{i}-" + "x" * 1000])) for i in range(pods)]


def test_an_answer_larger_than_http2s_default_windows_arrives_whole(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        big_node(kubelet, 3000)  # ~3 MiB: 48 times HTTP/2's initial 64 KiB window
        pods = decode_list_response(call(kubelet.socket_path, timeout=10))
    assert len(pods) == 3000 and pods[-1].name == "p2999"


def test_an_answer_over_the_limit_is_refused_not_held(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        big_node(kubelet, 2000)
        e = failure(kubelet.socket_path, timeout=10, max_bytes=1 * MIB)
    assert e.code == "RESOURCE_EXHAUSTED" and "larger than 1048576 bytes" in e.details


def test_the_servers_status_and_message_come_through(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.fail = True
        e = failure(kubelet.socket_path)
    assert (e.code, e.details) == ("UNAVAILABLE", "fake kubelet: failing on purpose")


def test_a_method_the_server_does_not_have_is_unimplemented(tmp_path: Path) -> None:
    """An older kubelet without the v1 API answers so."""
    with fake_kubelet(tmp_path) as kubelet:
        e = failure(kubelet.socket_path, method="/v1.PodResourcesLister/Watch")
    assert e.code == "UNIMPLEMENTED"


def test_a_hanging_server_costs_the_timeout_and_no_more(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.hang = math.inf
        e, elapsed = timed_failure(kubelet.socket_path, timeout=0.5)
        kubelet.release()
    # grpcio's server reads the grpc-timeout header and gives up first, as a kubelet does.
    assert e.code == "DEADLINE_EXCEEDED"
    assert 0.45 <= elapsed < 0.5 + LATE_S


# -- servers that get gRPC wrong -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("respond", "code", "says"),
    [
        pytest.param(
            lambda r: r.headers([(":status", "503"), ("content-type", "text/plain")], end=True),
            "UNAVAILABLE", "HTTP 503", id="http-503",
        ),
        pytest.param(
            lambda r: r.headers([(":status", "404")], end=True), "UNIMPLEMENTED", "HTTP 404", id="http-404"
        ),
        pytest.param(
            lambda r: r.headers([(":status", "418")], end=True), "UNKNOWN", "HTTP 418", id="http-418"
        ),
        pytest.param(
            lambda r: (r.headers([(":status", "200"), ("content-type", "text/html")]), r.data(b"<html>", end=True)),
            "UNKNOWN", "text/html, not application/grpc", id="not-grpc",
        ),
        pytest.param(
            lambda r: (r.grpc_headers(), r.data(framed(b"\x0a\x00"), end=True)),
            "INTERNAL", "without a grpc-status", id="no-status",
        ),
        pytest.param(
            grpc_answer(framed(b"\x0a\x00", compressed=True), OK), "INTERNAL", "compressed", id="compressed"
        ),
        pytest.param(
            grpc_answer(framed(b"abc", size=100), OK), "INTERNAL", "says 100 bytes and 3 came", id="short-message"
        ),
        pytest.param(
            grpc_answer(framed(b"") + framed(b""), OK), "INTERNAL", "says 0 bytes and 5 came", id="two-messages"
        ),
        pytest.param(grpc_answer(b"", OK), "INTERNAL", "holds 0 bytes, not a message", id="no-message"),
        pytest.param(grpc_answer(b"\x00\x00", OK), "INTERNAL", "holds 2 bytes", id="half-a-prefix"),
        pytest.param(
            grpc_answer(b"", [("grpc-status", "5"), ("grpc-message", "pod%20list%20gone%20%E2%9C%97")]),
            "NOT_FOUND", "pod list gone \u2717", id="status-with-message",
        ),
        pytest.param(
            lambda r: r.headers([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "7")],
                                end=True),
            "PERMISSION_DENIED", "grpc-status 7", id="trailers-only",
        ),
        pytest.param(grpc_answer(b"", [("grpc-status", "99")]), "UNKNOWN", "grpc-status 99", id="status-99"),
        pytest.param(grpc_answer(b"", [("grpc-status", "x")]), "UNKNOWN", "grpc-status x", id="status-x"),
        pytest.param(
            grpc_answer(b"", [("grpc-status", "\u00b2")]), "UNKNOWN", "grpc-status \u00b2", id="status-superscript"
        ),
        pytest.param(
            lambda r: (r.conn.reset_stream(r.stream, h2.errors.ErrorCodes.REFUSED_STREAM), r.flush()),
            "UNAVAILABLE", "reset the call (REFUSED_STREAM)", id="refused",
        ),
        pytest.param(
            lambda r: (r.conn.reset_stream(r.stream, h2.errors.ErrorCodes.INTERNAL_ERROR), r.flush()),
            "INTERNAL", "reset the call (INTERNAL_ERROR)", id="reset",
        ),
        pytest.param(
            lambda r: (r.conn.reset_stream(r.stream, h2.errors.ErrorCodes.CANCEL), r.flush()),
            "CANCELLED", "reset the call (CANCEL)", id="cancel",
        ),
        pytest.param(
            lambda r: (r.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR), r.flush()),
            "UNAVAILABLE", "GOAWAY NO_ERROR", id="goaway",
        ),
        pytest.param(
            lambda r: (r.conn.reset_stream(r.stream, 0x99), r.flush()),
            "INTERNAL", "reset the call (153)", id="reset-with-an-unknown-code",
        ),
        pytest.param(grpc_answer(b"", [("grpc-status", "17")]), "UNKNOWN", "grpc-status 17", id="status-17"),
        pytest.param(
            lambda r: (r.headers([(":status", "200")]), r.data(framed(b""), end=True)),
            "UNKNOWN", "the answer is untyped, not application/grpc", id="no-content-type",
        ),
        pytest.param(
            grpc_answer(b"", [(b"grpc-status", b"13"), (b"grpc-message", b"bad \xff byte")]),  # type: ignore[list-item]
            "INTERNAL", "bad \ufffd byte", id="message-not-utf8",
        ),
        pytest.param(header_bomb, "INTERNAL", "not valid HTTP/2", id="header-bomb"),
    ],
)  # fmt: skip
def test_a_server_that_gets_grpc_wrong_is_named(
    tmp_path: Path, respond: Callable[[Reply], None], code: str, says: str
) -> None:
    """An answer that is wrong is known from the answer, not at the timeout.  The server holds the
    connection open after answering and the call has NEVER_S: a client that did not judge the answer
    itself would end in DEADLINE_EXCEEDED, so the named error proves it was known long before the
    deadline, however slow this machine is (a wall-clock bound here measured the test server)."""
    fds = open_fds()
    answered = threading.Event()

    def respond_and_hold(r: Reply) -> None:
        respond(r)
        answered.wait(NEVER_S)

    with serving(tmp_path, h2_server(respond_and_hold)) as server:
        e = failure(server.path, timeout=NEVER_S)
        answered.set()
    assert e.code == code and says in e.details, (e.code, e.details)
    assert open_fds() <= fds, "no socket is left open"  # fewer: a grpcio server of an earlier test finished closing


def test_an_answer_followed_by_goaway_is_an_answer(tmp_path: Path) -> None:
    """A kubelet shutting down answers the call in flight, then says goodbye in the same write."""

    def answer_then_goaway(r: Reply) -> None:
        r.conn.send_headers(r.stream, [(":status", "200"), ("content-type", "application/grpc")])
        r.conn.send_data(r.stream, framed(b"\x0a\x03\x0a\x01p"))
        r.conn.send_headers(r.stream, OK, end_stream=True)
        r.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR)
        r.flush()

    with serving(tmp_path, h2_server(answer_then_goaway)) as server:
        assert [p.name for p in decode_list_response(call(server.path))] == ["p"]


def test_a_server_that_answers_http1_is_named(tmp_path: Path) -> None:
    def http1(sock: socket.socket) -> None:
        sock.recv(4096)
        sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    with serving(tmp_path, http1) as server:
        e = failure(server.path)
    assert e.code == "INTERNAL" and "does not speak HTTP/2: it began with b'HTTP/1.1 400 Bad Request" in e.details


def test_a_server_that_closes_at_once_is_unavailable(tmp_path: Path) -> None:
    with serving(tmp_path, lambda sock: None) as server:
        e = failure(server.path)
    # A close with the request unread is a reset on Linux; either way the server went away.
    assert e.code == "UNAVAILABLE"
    assert "closed the connection before the answer was complete" in e.details or "reset by peer" in e.details


def test_a_server_that_never_speaks_costs_the_timeout(tmp_path: Path) -> None:
    done = threading.Event()
    with serving(tmp_path, lambda sock: done.wait(NEVER_S)) as server:
        e, elapsed = timed_failure(server.path, timeout=0.4)
        done.set()
    assert (e.code, e.details) == ("DEADLINE_EXCEEDED", "no answer within 0.4 s (waiting for the answer)")
    assert 0.35 <= elapsed < 0.4 + LATE_S


def test_a_trickling_answer_is_cut_off_at_the_timeout_not_per_read(tmp_path: Path) -> None:
    """One byte every 20 ms: each read is quick, the whole answer never comes."""

    def trickle(r: Reply) -> None:
        r.grpc_headers()
        r.data(b"\x00\x00\x00\x10\x00")  # announces a 1 MiB message
        while True:
            r.data(b"\x0a")
            time.sleep(0.02)

    with serving(tmp_path, h2_server(trickle)) as server:
        e, elapsed = timed_failure(server.path, timeout=0.5)
    assert (e.code, e.details) == ("DEADLINE_EXCEEDED", "no answer within 0.5 s (waiting for the answer)")
    assert 0.45 <= elapsed < 0.5 + LATE_S


def test_an_endless_answer_stops_at_the_limit(tmp_path: Path) -> None:
    """A server that keeps sending, honouring flow control: the client stops it at its limit."""
    sent = [0]

    def endless(r: Reply) -> None:
        r.grpc_headers()
        r.data(framed(b"")[:1] + (2**31).to_bytes(4, "big"))
        chunk = b"\x0a" * 16384
        while True:
            window = min(r.conn.local_flow_control_window(r.stream), r.conn.max_outbound_frame_size)
            if window <= 0:
                r.pump()  # wait for the client's window updates
                continue
            r.data(chunk[:window])
            sent[0] += window

    with serving(tmp_path, h2_server(endless)) as server:
        e = failure(server.path, timeout=5.0, max_bytes=256 * 1024)
    assert e.code == "RESOURCE_EXHAUSTED" and "larger than 262144 bytes" in e.details
    assert sent[0] < 2 * MIB, "the client stopped reading near its limit"


def test_a_flood_of_pings_stops_at_the_limit(tmp_path: Path) -> None:
    """Frames that are not the answer still count: memory is bounded whatever the server sends."""

    def pings(r: Reply) -> None:
        threading.Thread(target=discard, args=(r.sock,), daemon=True).start()  # the client's acks
        n = 0
        while True:
            n += 1
            r.conn.ping(n.to_bytes(8, "big"))
            r.flush()

    with serving(tmp_path, h2_server(pings)) as server:
        e = failure(server.path, timeout=20.0, max_bytes=64 * 1024)
    assert e.code == "RESOURCE_EXHAUSTED" and "has not finished the answer" in e.details


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=300), prefix=st.booleans())
def test_any_bytes_from_the_server_end_as_an_rpc_error(tmp_path: Path, garbage: bytes, prefix: bool) -> None:
    """Garbage, or a valid HTTP/2 server preface followed by garbage: an RpcError, never a crash."""

    def spew(sock: socket.socket) -> None:
        if prefix:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
        sock.sendall(garbage)

    with serving(tmp_path, spew) as server:
        _, elapsed = timed_failure(server.path, timeout=1.0)
        assert elapsed < 1.0 + LATE_S


def test_no_socket_and_not_a_socket_are_unavailable(tmp_path: Path) -> None:
    e = failure(tmp_path / "absent.sock")
    assert e.code == "UNAVAILABLE" and "cannot connect to" in e.details and "No such file" in e.details
    (tmp_path / "file").write_text("not a socket")
    assert failure(tmp_path / "file").code == "UNAVAILABLE"


def test_failed_calls_leave_no_socket_behind(tmp_path: Path) -> None:
    """Two hundred failed refreshes (a node whose kubelet misbehaves for half an hour) hold no fd."""
    with serving(tmp_path, lambda sock: None) as closing, fake_kubelet(tmp_path / "k") as kubelet:
        kubelet.fail = True
        assert failure(kubelet.socket_path).code == "UNAVAILABLE"  # grpcio's server opens what it keeps
        fds = open_fds()
        for _ in range(100):
            assert failure(closing.path).code == "UNAVAILABLE"
            assert failure(kubelet.socket_path).code == "UNAVAILABLE"
        # A socket left per call would be 200 more; the servers' own threads may still be closing theirs.
        assert open_fds() <= fds + 4


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_ends_a_call_in_flight_at_once(tmp_path: Path) -> None:
    done = threading.Event()
    with serving(tmp_path, lambda sock: done.wait(NEVER_S)) as server:
        c = UnaryCall(str(server.path), LIST_METHOD, timeout=NEVER_S, max_message_bytes=MIB)
        result: list[RpcError] = []

        def run() -> None:
            try:
                c.run()
            except RpcError as e:
                result.append(e)

        t = threading.Thread(target=run)
        t.start()
        assert wait_until(lambda: server.connections > 0)
        time.sleep(0.05)  # the client is in recv() by now
        c.cancel()
        # Only the cancel can end the call this soon: the server holds on and the timeout is NEVER_S.
        t.join(LATE_S)
        ended = not t.is_alive()
        done.set()
    assert ended, "the cancel did not end the call"
    assert [(e.code, e.details) for e in result] == [("CANCELLED", "the call was cancelled")]


def test_a_call_cancelled_before_it_starts_never_connects(tmp_path: Path) -> None:
    with serving(tmp_path, lambda sock: None) as server:
        c = UnaryCall(str(server.path), LIST_METHOD, timeout=5, max_message_bytes=MIB)
        c.cancel()
        with pytest.raises(RpcError) as caught:
            c.run()
        time.sleep(0.1)
        assert server.connections == 0
    assert (caught.value.code, caught.value.details) == ("CANCELLED", "the call was cancelled before it started")


@pytest.mark.parametrize("late", [False, True], ids=["in-time", "past-the-deadline"])
def test_a_cancel_that_lands_while_the_call_connects_still_ends_it_at_once(tmp_path: Path, late: bool) -> None:
    """stop() can come between the call taking its socket and connecting it.  The call must end at
    once all the same (Linux keeps the shutdown of an unconnected unix socket, so its first read
    returns nothing), not wait out its timeout against a kubelet that never answers; and when the
    deadline passes meanwhile, the call still says it was cancelled, not that it timed out."""
    done = threading.Event()
    with serving(tmp_path, lambda sock: done.wait(NEVER_S)) as server:
        reads = 0

        def clock() -> float:  # read once for the deadline, then just before connecting
            nonlocal reads
            reads += 1
            if reads == 2:
                c.cancel()
            return time.monotonic() + (2 * NEVER_S if late and reads >= 2 else 0)

        # A lost cancel says CANCELLED too, at the timeout: the timeout is NEVER_S, so a call that
        # ends within LATE_S was ended by the cancel.
        c = UnaryCall(str(server.path), LIST_METHOD, timeout=NEVER_S, max_message_bytes=MIB, clock=clock)
        t0 = time.monotonic()
        with pytest.raises(RpcError) as caught:
            c.run()
        elapsed = time.monotonic() - t0
        done.set()
    assert (caught.value.code, caught.value.details) == ("CANCELLED", "the call was cancelled")
    assert elapsed < LATE_S


def test_cancel_after_the_call_has_ended_does_nothing(tmp_path: Path) -> None:
    """The watcher's stop() can come just after a refresh finished."""
    with fake_kubelet(tmp_path) as kubelet:
        c = UnaryCall(str(kubelet.socket_path), LIST_METHOD, timeout=2, max_message_bytes=MIB)
        c.run()
        c.cancel()


# -- through the watcher -------------------------------------------------------------------------


def test_a_kubelet_answer_that_is_not_protobuf_keeps_the_last_good_pods(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
        path = kubelet.socket_path
        w = PodResourcesWatcher(str(path), timeout=LATE_S)
        assert w.refresh()
    try:
        with capture_logs() as logs, serving(tmp_path, h2_server(grpc_answer(framed(b"\x0a\x05ab"), OK)), path):
            assert not w.refresh()
            assert dict(w.devices()) == {"GPU-a": (PodRef("ns", "p", "main"),)}
        failed = [e for e in logs if e["event"] == "pod_attribution_failed"]
        assert len(failed) == 1 and failed[0]["reason"] == "MALFORMED"
        assert "not a ListPodResourcesResponse: field 1 says 5 bytes, 2 are left" in failed[0]["error"]
    finally:
        w.stop()


# -- what the kubelet receives -------------------------------------------------------------------


class Capture:
    """An HTTP/2 server that records the request it got, then answers an empty pod list."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = b""

    def __call__(self, sock: socket.socket) -> None:
        h2_server(self._answer)(sock)

    def _answer(self, r: Reply) -> None:
        self.headers, self.body = r.request_headers, r.request_body
        grpc_answer(framed(b""), OK)(r)


def test_the_kubelet_gets_a_request_that_grpc_go_accepts(tmp_path: Path) -> None:
    """The kubelet is grpc-go, which refuses a request without ``content-type: application/grpc`` or
    with a malformed length prefix, and ends the call at the ``grpc-timeout`` it is given."""
    capture = Capture()
    reads = 0
    start = time.monotonic()

    def clock() -> float:  # 0.25 s have passed when the third reading sets the grpc-timeout header
        nonlocal reads
        reads += 1
        return start + (0.25 if reads >= 3 else 0.0)

    with serving(tmp_path, capture) as server:
        UnaryCall(str(server.path), LIST_METHOD, b"abc", timeout=NEVER_S, max_message_bytes=MIB, clock=clock).run()
    h = capture.headers
    assert (h[":method"], h[":scheme"], h[":path"], h["content-type"], h["te"]) == (
        "POST", "http", LIST_METHOD, "application/grpc", "trailers"
    )  # fmt: skip
    assert capture.body == b"\x00\x00\x00\x00\x03abc"  # uncompressed, 4-byte big-endian length
    # At most 8 digits (gRPC's PROTOCOL-HTTP2.md), and what is left of the call's time, not all of it.
    assert h["grpc-timeout"] == f"{int((NEVER_S - 0.25) * 1000)}m"


def test_the_watcher_asks_for_every_pod_and_says_who_asks(tmp_path: Path) -> None:
    """An empty ListPodResourcesRequest (its proto has no fields), and a user-agent an operator
    reading the kubelet's logs can tell apart."""
    capture = Capture()
    with serving(tmp_path, capture) as server:
        assert PodResourcesWatcher(str(server.path), timeout=LATE_S).refresh()
    assert capture.body == b"\x00\x00\x00\x00\x00"
    assert capture.headers["user-agent"].startswith("gpu-exporter")


def test_a_timeout_of_days_is_sent_in_the_eight_digits_grpc_allows(tmp_path: Path) -> None:
    capture = Capture()
    with serving(tmp_path, capture) as server:
        UnaryCall(str(server.path), LIST_METHOD, timeout=10.0**6, max_message_bytes=MIB).run()
    assert capture.headers["grpc-timeout"] == "99999999m"


# -- the first frame -----------------------------------------------------------------------------


def frame(kind: int, stream: int, payload: bytes, flags: int = 0) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


SETTINGS, PING, DATA, GOAWAY = 0x4, 0x6, 0x0, 0x7
MAX_STREAMS_100 = (3).to_bytes(2, "big") + (100).to_bytes(4, "big")  # SETTINGS_MAX_CONCURRENT_STREAMS


def opening_with(first: bytes) -> Callable[[socket.socket], None]:
    """A server that sends ``first`` instead of its own SETTINGS frame, then answers as HTTP/2 would."""

    def handle(sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        conn.data_to_send()
        sock.sendall(first)
        h2_server(grpc_answer(framed(b"\x0a\x03\x0a\x01p"), OK))(sock, conn)

    return handle


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(frame(PING, 0, b"\x00" * 8), id="ping"),
        pytest.param(frame(DATA, 1, b"\x00" * 6), id="data"),
        pytest.param(frame(GOAWAY, 0, b"\x00" * 12), id="goaway"),
        pytest.param(frame(SETTINGS, 1, b""), id="settings-on-a-stream"),
        pytest.param(frame(SETTINGS, 0x0100_0000, b""), id="settings-on-a-high-stream"),
        pytest.param(frame(SETTINGS, 0, b"\x00" * 7), id="settings-of-7-bytes"),
        pytest.param(frame(SETTINGS, 0, MAX_STREAMS_100 * 65), id="settings-of-65-entries"),
    ],
)
def test_a_server_that_does_not_open_with_settings_is_refused_at_once(tmp_path: Path, first: bytes) -> None:
    """RFC 9113 3.4: a server's connection preface is a SETTINGS frame on stream 0."""
    with serving(tmp_path, opening_with(first)) as server:
        e = failure(server.path, timeout=NEVER_S)
    # The server goes on to answer properly after its wrong first frame: the error proves the client
    # judged that frame, and did not wait for the rest (nor for the timeout).
    assert e.code == "INTERNAL" and "does not speak HTTP/2: it began with" in e.details, e


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(frame(SETTINGS, 0, MAX_STREAMS_100 * 64), id="64-entries"),
        pytest.param(frame(SETTINGS, 0x8000_0000, MAX_STREAMS_100), id="reserved-bit-set"),
    ],
)
def test_any_valid_opening_settings_frame_is_accepted(tmp_path: Path, first: bytes) -> None:
    """As many settings as a server may repeat, and the stream id's reserved bit, which RFC 9113 4.1
    says a receiver ignores."""
    with serving(tmp_path, opening_with(first)) as server:
        assert [p.name for p in decode_list_response(call(server.path))] == ["p"]


@pytest.mark.parametrize("cut", [1, 4, 8])
def test_an_http1_reply_is_named_however_its_first_bytes_arrive(tmp_path: Path, cut: int) -> None:
    """The first nine bytes are judged together, even when they come in pieces."""
    reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"

    def http1(sock: socket.socket) -> None:
        sock.recv(4096)
        sock.sendall(reply[:cut])
        time.sleep(0.1)  # the client reads the first piece alone
        sock.sendall(reply[cut:])
        done.wait(NEVER_S)  # and keeps the connection open: only the bytes can tell

    done = threading.Event()
    with serving(tmp_path, http1) as server:
        # The call has NEVER_S and the server holds on: a client that did not judge the bytes as they
        # came would end in DEADLINE_EXCEEDED, not in this error.
        e = failure(server.path, timeout=NEVER_S)
        done.set()
    assert e.code == "INTERNAL" and "does not speak HTTP/2" in e.details, e


# -- limits and odd but valid answers --------------------------------------------------------------


def send_all(r: Reply, data: bytes) -> None:
    """Sends ``data`` on the call's stream as flow control allows."""
    while data:
        room = min(r.conn.local_flow_control_window(r.stream), r.conn.max_outbound_frame_size, len(data))
        if room <= 0:
            r.pump()
            continue
        r.data(data[:room])
        data = data[room:]


@pytest.mark.parametrize("extra", [0, 1])
def test_a_message_of_exactly_the_limit_arrives_and_one_byte_more_does_not(tmp_path: Path, extra: int) -> None:
    """The limit is the message's size, its 5-byte prefix aside; here past 16 MiB, where the length
    prefix's first byte is no longer 0."""
    limit = 2**24 + 3
    message = b"\x0a" * (limit + extra)

    def respond(r: Reply) -> None:
        r.grpc_headers()
        send_all(r, framed(message))
        r.trailers(OK)

    with serving(tmp_path, h2_server(respond)) as server:
        if extra:
            e = failure(server.path, timeout=20.0, max_bytes=limit)
            assert e.code == "RESOURCE_EXHAUSTED" and f"larger than {limit} bytes" in e.details
        else:
            assert call(server.path, timeout=20.0, max_bytes=limit) == message


def test_a_limit_beyond_http2s_largest_window_still_works(tmp_path: Path) -> None:
    """HTTP/2 windows stop at 2^31 - 1 bytes; a larger limit is held to that, not sent as is."""
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
        answer = call(kubelet.socket_path, max_bytes=2**32)
    assert [p.name for p in decode_list_response(answer)] == ["p"]


def test_a_server_push_is_refused(tmp_path: Path) -> None:
    """The client turns push off; a server that pushes anyway is not speaking HTTP/2 as agreed, and
    what it pushed never mixes into the answer."""

    def respond(r: Reply) -> None:
        block = hpack.Encoder().encode([(":method", "GET"), (":scheme", "http"), (":path", "/x"),
                                        (":authority", "localhost")])  # fmt: skip
        r.sock.sendall(frame(0x5, r.stream, (2).to_bytes(4, "big") + block, flags=0x4))  # PUSH_PROMISE
        grpc_answer(framed(b"\x0a\x03\x0a\x01p"), OK)(r)

    with serving(tmp_path, h2_server(respond)) as server:
        e = failure(server.path)
    assert (e.code, e.details) == ("INTERNAL", "the answer is not valid HTTP/2 (Received pushed stream)")


def test_what_h2_says_is_wrong_is_kept_short(tmp_path: Path) -> None:
    """h2 quotes the offending header in its error; the sentence keeps 200 characters of that reason."""
    opening = "the answer is not valid HTTP/2 ("

    def reason_for(name_length: int) -> str:
        name = b"x-" + b"a" * name_length + b"\xc3"  # not a valid header name

        def respond(r: Reply) -> None:
            r.sock.sendall(frame(0x1, r.stream, hpack.Encoder().encode([(name, b"v")]), flags=0x4))  # HEADERS

        with serving(tmp_path, h2_server(respond)) as server:
            e = failure(server.path)
        assert e.code == "INTERNAL" and e.details.startswith(opening + "Illegal character") and e.details[-1] == ")"
        return e.details[len(opening) : -1]

    whole = reason_for(10)
    assert whole.endswith("aaa\\xc3'"), whole  # h2 quotes the name
    fits = 10 + 200 - len(whole)  # the name length that makes the reason exactly 200 characters
    assert reason_for(fits).endswith("aaa\\xc3'") and len(reason_for(fits)) == 200
    cut = reason_for(fits + 10)
    assert cut.endswith("aaa...") and len(cut) == 203, cut


# -- a kubelet that is stuck -----------------------------------------------------------------------


def test_a_kubelet_whose_accept_queue_is_full_is_unavailable_at_once(tmp_path: Path) -> None:
    """A kubelet too busy to accept: connecting would wait for room, so the call says so now."""
    path = socket_path_in(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    queued = []
    try:
        while True:  # fill the queue; nobody accepts
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            queued.append(s)
            s.connect(str(path))
    except BlockingIOError:
        pass
    try:
        # Connecting would wait for room until the timeout (DEADLINE_EXCEEDED); with NEVER_S of it,
        # UNAVAILABLE says the call did not wait.
        e = failure(path, timeout=NEVER_S)
    finally:
        for s in queued:
            s.close()
        listener.close()
    assert e.code == "UNAVAILABLE" and f"cannot connect to {path}: Resource temporarily unavailable" in e.details


def test_a_kubelet_that_stops_reading_costs_the_timeout_and_no_more(tmp_path: Path) -> None:
    """It pings, never reads the acks: once they fill the socket, writing blocks.  The deadline holds
    for writes as for reads."""

    def pings_unread(sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        n = 0
        with contextlib.suppress(OSError):  # the client gives up and closes
            while True:
                n += 1
                conn.ping(n.to_bytes(8, "big"))
                sock.sendall(conn.data_to_send())

    with serving(tmp_path, pings_unread) as server:
        e, elapsed = timed_failure(server.path, timeout=1.0)
    assert (e.code, e.details) == ("DEADLINE_EXCEEDED", "no answer within 1 s (sending)")
    assert 0.9 <= elapsed < 1.0 + LATE_S


def test_a_kubelet_that_hangs_up_before_the_request_says_so_and_why_writing_failed(tmp_path: Path) -> None:
    closed = threading.Event()

    def hang_up(sock: socket.socket) -> None:
        sock.close()
        closed.set()

    reads = 0

    def clock() -> float:  # once connected (the third reading), wait for the kubelet to hang up
        nonlocal reads
        reads += 1
        if reads == 3:
            assert closed.wait(LATE_S)
        return time.monotonic()

    with serving(tmp_path, hang_up) as server, pytest.raises(RpcError) as caught:
        UnaryCall(str(server.path), LIST_METHOD, timeout=NEVER_S, max_message_bytes=MIB, clock=clock).run()
    assert (caught.value.code, caught.value.details) == (
        "UNAVAILABLE",
        "the server closed the connection before the answer was complete (writing to it failed: Broken pipe)",
    )


def test_a_kubelet_that_reads_the_request_and_hangs_up_says_only_that(tmp_path: Path) -> None:
    """Writing did not fail here: the sentence says the connection closed, and nothing about writing."""

    def read_then_close(r: Reply) -> None:
        r.sock.shutdown(socket.SHUT_WR)
        discard(r.sock)

    with serving(tmp_path, h2_server(read_then_close)) as server:
        e = failure(server.path)
    assert (e.code, e.details) == ("UNAVAILABLE", "the server closed the connection before the answer was complete")


@pytest.mark.parametrize(
    ("reading", "past", "step"),
    [
        (2, 0.0, "connecting"),  # exactly at the deadline is past it
        (2, 1.0, "connecting"),
        (3, 1.0, "sending"),  # the grpc-timeout header is what is left
        (4, 1.0, "sending"),
        (5, 1.0, "waiting for the answer"),
    ],
)
def test_a_deadline_that_passes_between_steps_names_the_step(
    tmp_path: Path, reading: int, past: float, step: str
) -> None:
    """The clock is read for the deadline, then before each step; the call stops at the first
    reading that finds no time left, and says what it was doing."""
    done = threading.Event()
    reads = 0
    start = time.monotonic()

    def clock() -> float:
        nonlocal reads
        reads += 1
        return start + (2.0 + past if reads >= reading else 0.0)

    with serving(tmp_path, lambda sock: done.wait(NEVER_S)) as server:
        with pytest.raises(RpcError) as caught:
            UnaryCall(str(server.path), LIST_METHOD, timeout=2.0, max_message_bytes=MIB, clock=clock).run()
        done.set()
    assert (caught.value.code, caught.value.details) == ("DEADLINE_EXCEEDED", f"no answer within 2 s ({step})")


def test_with_under_a_millisecond_left_the_kubelet_is_given_one(tmp_path: Path) -> None:
    capture = Capture()
    reads = 0
    start = time.monotonic()

    def clock() -> float:  # the third reading sets the grpc-timeout header
        nonlocal reads
        reads += 1
        return start + (NEVER_S - 0.0004 if reads == 3 else 0.0)

    with serving(tmp_path, capture) as server:
        UnaryCall(str(server.path), LIST_METHOD, timeout=NEVER_S, max_message_bytes=MIB, clock=clock).run()
    assert capture.headers["grpc-timeout"] == "1m"
