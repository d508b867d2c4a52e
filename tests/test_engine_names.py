"""Container names from an engine's API socket (Docker's inspect call, which Podman answers too):
one read-only call per container, within a timeout whatever the engine does, the answer bounded,
an engine that fails left alone for a while, the names cached and the cache bounded.

The engine here is a unix-socket HTTP server that behaves as told; tests/test_podman_holders.py
asks a real Podman."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.holders.engines import (
    MAX_ANSWER_BYTES,
    MAX_NAME_CHARS,
    EngineError,
    EngineNames,
    Inspected,
    inspect,
    inspect_name,
)
from tests.timing import NEVER_S

ID_A = "a" * 64
ID_B = "b" * 64


class FakeEngine:
    """Answers each connection with ``answer(request)`` (bytes, or None to say nothing), then closes."""

    def __init__(self, path: Path, answer: Callable[[bytes], bytes | None]) -> None:
        self.path = path
        self.answer = answer
        self.requests: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(str(path))
        self._server.listen(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            self.requests.append(request)
            out = self.answer(request)
            if out is None:
                self._stop.wait(NEVER_S)  # hold the connection, say nothing
                return
            with suppress(OSError):
                conn.sendall(out)

    def close(self) -> None:
        self._stop.set()
        self._server.close()


@contextmanager
def engine(tmp_path: Path, answer: Callable[[bytes], bytes | None]) -> Iterator[FakeEngine]:
    e = FakeEngine(tmp_path / "engine.sock", answer)
    try:
        yield e
    finally:
        e.close()


def http(status: str, body: bytes | str, headers: str = "Content-Type: application/json\r\n") -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(data)}\r\n\r\n".encode() + data


def inspect_answer(names: dict[str, str]) -> Callable[[bytes], bytes]:
    """Docker's answer to GET /containers/<id>/json: the container's JSON, Name with its leading /."""

    def answer(request: bytes) -> bytes:
        line = request.split(b"\r\n", 1)[0].decode()
        method, path, _ = line.split(" ")
        cid = path.removeprefix("/containers/").removesuffix("/json")
        if method != "GET" or cid not in names:
            return http("404 Not Found", json.dumps({"message": f"No such container: {cid}"}))
        return http("200 OK", json.dumps({"Id": cid, "Name": "/" + names[cid], "State": {"Pid": 1}}))

    return answer


def test_the_name_comes_from_one_get_of_the_inspect_call(tmp_path: Path) -> None:
    with engine(tmp_path, inspect_answer({ID_A: "trainer"})) as e:
        names = EngineNames({"docker": str(e.path)})
        assert names.name("docker", ID_A) == "trainer"
        assert names.name("docker", ID_A) == "trainer"  # cached: asked once
        (request,) = e.requests
        assert request.startswith(f"GET /containers/{ID_A}/json HTTP/1.0\r\n".encode())
        assert b"User-Agent: gpu-exporter\r\n" in request


def test_an_engine_without_a_socket_setting_or_api_is_never_asked(tmp_path: Path) -> None:
    with engine(tmp_path, inspect_answer({ID_A: "trainer"})) as e:
        names = EngineNames({"docker": str(e.path), "containerd": str(e.path), "podman": ""})
        assert names.name("containerd", ID_A) == "" and names.name("cri-o", ID_A) == ""
        assert names.name("podman", ID_A) == ""
        assert e.requests == []


def test_a_container_the_engine_does_not_know_is_asked_again_only_after_a_while(tmp_path: Path) -> None:
    now = [0.0]
    with engine(tmp_path, inspect_answer({ID_A: "trainer"})) as e:
        names = EngineNames({"docker": str(e.path)}, retry_after=60.0, clock=lambda: now[0])
        assert names.name("docker", ID_B) == ""
        assert names.name("docker", ID_B) == ""
        assert len(e.requests) == 1
        assert names.name("docker", ID_A) == "trainer"  # the engine is not down: another container is asked
        assert names.errors == 0  # not knowing a container is no failure
        now[0] += 60.0
        assert names.name("docker", ID_B) == ""
        assert len(e.requests) == 3


@pytest.mark.parametrize(
    ("what", "answer", "error"),
    [
        ("says nothing", lambda r: None, "no whole answer within 0.3 s"),
        ("drips its answer a byte at a time", "drip", "no whole answer within 0.3 s"),
        ("answers more than 1 MiB", lambda r: http("200 OK", b"x" * (2 * 1024 * 1024)), "an answer over 1048576 bytes"),
        ("is not HTTP", lambda r: b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "an answer that is not HTTP"),
        ("fails", lambda r: http("500 Internal Server Error", "{}"), "HTTP status 500"),
        ("answers no JSON", lambda r: http("200 OK", "<html>"), r"an answer that is not JSON \(JSONDecodeError\)"),
        ("answers without a name", lambda r: http("200 OK", '{"Id": "x"}'), "an answer without a Name"),
    ],
)
def test_whatever_the_engine_does_a_lookup_ends_within_its_timeout(
    tmp_path: Path, what: str, answer: object, error: str
) -> None:
    stop = threading.Event()

    def drip(request: bytes) -> bytes | None:
        return None

    def respond(request: bytes) -> bytes | None:
        assert callable(answer)
        out: bytes | None = answer(request)
        return out

    if answer == "drip":

        class Dripping(FakeEngine):
            def _one(self, conn: socket.socket) -> None:
                with conn:
                    conn.recv(4096)
                    for byte in http("200 OK", json.dumps({"Name": "/slow"})):
                        if stop.wait(0.05):
                            return
                        try:
                            conn.sendall(bytes([byte]))
                        except OSError:
                            return

        e: FakeEngine = Dripping(tmp_path / "engine.sock", drip)
    else:
        e = FakeEngine(tmp_path / "engine.sock", respond)
    try:
        started = time.monotonic()
        with pytest.raises(EngineError, match=f"^{error}$"):
            inspect_name(str(e.path), ID_A, timeout=0.3)
        assert time.monotonic() - started < NEVER_S, what  # it ended; that it ended at all is the point
    finally:
        stop.set()
        e.close()


def test_an_engine_that_fails_is_left_alone_for_a_while_and_said_once(tmp_path: Path) -> None:
    now = [0.0]
    calls = []

    def ask(path: str, cid: str, timeout: float) -> Inspected:
        calls.append(cid)
        raise EngineError("no whole answer within 1 s")

    names = EngineNames({"docker": "/run/docker.sock"}, retry_after=60.0, clock=lambda: now[0], ask=ask)
    with capture_logs() as logs:
        assert names.name("docker", ID_A) == ""
        assert names.name("docker", ID_B) == ""  # not asked: the engine is down
        now[0] += 59.0
        assert names.name("docker", ID_B) == ""
        now[0] += 1.0
        assert names.name("docker", ID_B) == ""  # asked again after retry_after, and failed again
    assert calls == [ID_A, ID_B]
    assert names.errors == 2
    assert logs == [{  # the same reason: said once
        "event": "container_names_unavailable", "log_level": "warning", "engine": "docker",
        "socket": "/run/docker.sock", "error": "EngineError: no whole answer within 1 s",
        "detail": "docker containers are shown by short ID; asking again in 60 s",
    }]  # fmt: skip
    # It answers again: said once, and names come back.
    calls.clear()
    names._ask = lambda path, cid, timeout: Inspected("trainer")
    now[0] += 60.0
    with capture_logs() as logs:
        assert names.name("docker", ID_B) == "trainer"
        assert names.name("docker", ID_A) == "trainer"
    assert logs == [{"event": "container_names_available", "log_level": "info", "engine": "docker",
                     "socket": "/run/docker.sock"}]  # fmt: skip


def test_an_engine_that_answers_from_the_start_is_not_said(tmp_path: Path) -> None:
    with engine(tmp_path, inspect_answer({ID_A: "trainer", ID_B: "eval"})) as e, capture_logs() as logs:
        names = EngineNames({"docker": str(e.path)})
        assert names.name("docker", ID_A) == "trainer" and names.name("docker", ID_B) == "eval"
    assert logs == []


def test_a_host_without_the_engine_is_said_quietly(tmp_path: Path) -> None:
    names = EngineNames({"podman": str(tmp_path / "none.sock")})
    with capture_logs() as logs:
        assert names.name("podman", ID_A) == ""
    assert [(e["event"], e["log_level"]) for e in logs] == [("container_names_unavailable", "info")]
    assert logs[0]["error"] == "FileNotFoundError: No such file or directory"


def test_the_cache_is_bounded_and_keeps_the_names_in_use(tmp_path: Path) -> None:
    ids = [f"{i:064x}" for i in range(5)]
    with engine(tmp_path, inspect_answer({cid: f"c{i}" for i, cid in enumerate(ids)})) as e:
        names = EngineNames({"docker": str(e.path)}, cache_size=3)
        for cid in ids[:3]:
            names.name("docker", cid)
        assert [names.name("docker", cid) for cid in ids[:3]] == ["c0", "c1", "c2"]
        assert len(e.requests) == 3  # three fit: none asked twice
        names.name("docker", ids[0])  # in use: stays
        names.name("docker", ids[3])  # pushes out the least recently used, ids[1]
        asked = len(e.requests)
        assert names.name("docker", ids[0]) == "c0" and len(e.requests) == asked
        assert names.name("docker", ids[1]) == "c1" and len(e.requests) == asked + 1


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ('{"Name": "/Xavier"}', "Xavier"),  # only the leading slash goes
        ('{\r\n\r\n"Name": "/spaced"}', "spaced"),  # JSON may hold the blank line that ends the head
    ],
)
def test_the_name_is_read_from_the_answer_as_sent(tmp_path: Path, body: str, name: str) -> None:
    with engine(tmp_path, lambda r: http("200 OK", body)) as e:
        assert inspect_name(str(e.path), ID_A, timeout=NEVER_S) == name


def test_an_answer_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    def answer_of(n: int) -> bytes:
        return http("200 OK", '{"Name": "/big", "x": "' + "y" * n + '"}')

    n = MAX_ANSWER_BYTES - 200
    n += MAX_ANSWER_BYTES - len(answer_of(n))
    assert len(answer_of(n)) == MAX_ANSWER_BYTES
    with engine(tmp_path, lambda r: answer_of(n)) as e:
        assert inspect_name(str(e.path), ID_A, timeout=NEVER_S) == "big"
    (tmp_path / "engine.sock").unlink()
    with engine(tmp_path, lambda r: answer_of(n + 1)) as e, pytest.raises(EngineError, match="an answer over"):
        inspect_name(str(e.path), ID_A, timeout=NEVER_S)


def test_an_answer_that_is_not_an_object_has_no_name(tmp_path: Path) -> None:
    with engine(tmp_path, lambda r: http("200 OK", "[]")) as e, pytest.raises(EngineError, match="without a Name"):
        inspect_name(str(e.path), ID_A, timeout=NEVER_S)


def test_an_engine_that_does_not_accept_is_a_failure_at_once(tmp_path: Path) -> None:
    """Its listen queue is full: a blocking connect would wait for ever; with the timeout set, the
    kernel refuses it at once (EAGAIN), which counts as the engine failing."""
    path = tmp_path / "full.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(0)
    waiting = []
    try:
        for _ in range(4):  # fill the queue; these never get accepted
            c = socket.socket(socket.AF_UNIX)
            c.setblocking(False)
            with suppress(OSError):
                c.connect(str(path))
            waiting.append(c)
        with pytest.raises(BlockingIOError):
            inspect_name(str(path), ID_A, timeout=NEVER_S)
    finally:
        for c in waiting:
            c.close()
        server.close()


def test_a_hostile_name_is_decoded_and_cut(tmp_path: Path) -> None:
    raw = json.dumps({"Name": "/evil\x1b]0;pwned\x07\n" + "n" * 500}).encode()
    with engine(tmp_path, lambda r: http("200 OK", raw)) as e:
        name = EngineNames({"podman": str(e.path)}).name("podman", ID_A)
    assert name.startswith("evil\x1b]0;pwned\x07\n") and len(name) == MAX_NAME_CHARS  # escaped where shown


def test_only_a_container_id_ever_reaches_the_request_line(tmp_path: Path) -> None:
    with engine(tmp_path, inspect_answer({})) as e, pytest.raises(EngineError, match=r"^not a container ID$"):
        inspect_name(str(e.path), "../../images/create?fromImage=x", timeout=1.0)
    assert e.requests == []


@pytest.mark.parametrize(
    ("state", "pid"),
    [
        ({"State": {"Running": True, "Pid": 4242}}, 4242),
        ({"State": {"Pid": 0}}, 0),  # not running
        ({"State": {"Pid": -1}}, 0),
        ({"State": {"Pid": 2**31 - 1}}, 2**31 - 1),
        ({"State": {"Pid": 2**31}}, 0),  # no pid is that large: not put in a /proc path
        ({"State": {"Pid": True}}, 0),  # JSON's true is no pid
        ({"State": {"Pid": "4242"}}, 0),
        ({"State": "running"}, 0),
        ({}, 0),
    ],
)
def test_the_init_pid_is_taken_only_as_a_plain_positive_number(tmp_path: Path, state: dict[str, object],
                                                                pid: int) -> None:  # fmt: skip
    body = json.dumps({"Name": "/trainer", **state})
    with engine(tmp_path, lambda r: http("200 OK", body)) as e:
        assert inspect(str(e.path), ID_A, timeout=NEVER_S) == Inspected("trainer", pid)
