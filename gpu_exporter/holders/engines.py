"""Container names from the engines' API sockets: Docker's, and Podman's Docker-compatible one.

The cgroup path gives a container's ID, not its name.  Where an engine's socket is configured and
readable, one ``GET /containers/<id>/json`` per container (the inspect call of ``docker inspect``)
gives the name; nothing else is ever asked, and nothing is written.  containerd and CRI-O speak
gRPC and have no such call: their containers are shown by short ID.

The cost is bounded on every side:

- a name is asked once per container and cached (at most ``cache_size`` containers, the least
  recently used leaving first), so a poll asks nothing once its containers are known;
- a call takes at most ``timeout`` seconds, whatever the engine does (no answer, an answer dripped
  a byte at a time); the answer is read to at most 1 MiB;
- an engine whose socket is missing, refuses, fails or times out is not asked again for
  ``retry_after`` seconds: its containers are shown by short ID meanwhile, and a hung engine costs
  the poller one ``timeout`` per ``retry_after``.

A name is the engine's answer, and a container's name is chosen by whoever started it: it is
decoded leniently and cut to 128 characters here, escaped wherever it is shown.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import structlog

from .. import untrusted

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 1.0
DEFAULT_RETRY_AFTER_S = 60.0
DEFAULT_CACHE_SIZE = 1024
MAX_ANSWER_BYTES = 1024 * 1024
MAX_NAME_CHARS = 128
# The engines that answer Docker's inspect call on their socket.
API_ENGINES = ("docker", "podman")
_ID = re.compile(r"[0-9a-f]{64}")
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})[ \r]")


class EngineError(Exception):
    """The engine did not answer as it should; the message says how."""


def inspect_name(socket_path: str, container_id: str, timeout: float) -> str:
    """The name of a container, from ``GET /containers/<id>/json`` on an engine's socket; "" where
    the engine does not know the container.  Raises EngineError (or OSError) on anything else."""
    if not _ID.fullmatch(container_id):
        raise EngineError("not a container ID")  # never put anything else in the request line
    try:
        answer = _get(socket_path, f"/containers/{container_id}/json", timeout)
    except TimeoutError as e:
        raise EngineError(f"no whole answer within {timeout:g} s") from e
    status = _STATUS.match(answer)
    _, sep, body = answer.partition(b"\r\n\r\n")
    if status is None or not sep:
        raise EngineError("an answer that is not HTTP")
    code = int(status.group(1))
    if code == 404:
        return ""  # gone already, or not this engine's
    if code != 200:
        raise EngineError(f"HTTP status {code}")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise EngineError(f"an answer that is not JSON ({e.__class__.__name__})") from e
    name = doc.get("Name") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise EngineError("an answer without a Name")
    return untrusted.text(name).lstrip("/")[:MAX_NAME_CHARS]


def _get(socket_path: str, path: str, timeout: float) -> bytes:
    """The whole answer to ``GET path`` on a unix socket, within ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        # HTTP/1.0: the engine answers and closes, with no chunked encoding to undo.
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\nUser-Agent: gpu-exporter\r\n\r\n".encode())
        answer = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                return bytes(answer)
            answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                raise EngineError(f"an answer over {MAX_ANSWER_BYTES} bytes")


class EngineNames:
    """Container names by engine and ID, from the engines' sockets (see the module)."""

    def __init__(
        self,
        sockets: Mapping[str, str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_after: float = DEFAULT_RETRY_AFTER_S,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        ask: Callable[[str, str, float], str] = inspect_name,
    ) -> None:
        self.sockets = {engine: path for engine, path in sockets.items() if engine in API_ENGINES and path}
        self.timeout = timeout
        self.retry_after = retry_after
        self.cache_size = cache_size
        self._clock = clock
        self._ask = ask
        self._names: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._down_until: dict[str, float] = {}
        self._unknown: dict[tuple[str, str], float] = {}  # containers the engine did not know -> ask again at
        self._state: dict[str, str] = {}  # engine -> "ok" or the last failure, to log changes only
        self.errors = 0  # failed calls, for the exporter's own metrics

    def name(self, engine: str, container_id: str) -> str:
        """The container's name, "" where it is not known (no socket, the engine is down, or it
        does not know the container).  Asks the engine at most once per container while it answers."""
        key = (engine, container_id)
        if key in self._names:
            self._names.move_to_end(key)
            return self._names[key]
        path = self.sockets.get(engine)
        now = self._clock()
        if path is None or now < self._down_until.get(engine, now) or now < self._unknown.get(key, now):
            return ""
        try:
            name = self._ask(path, container_id, self.timeout)
        except (OSError, EngineError) as e:
            self.errors += 1
            self._down_until[engine] = self._clock() + self.retry_after
            reason = f"{type(e).__name__}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
            if self._state.get(engine) != reason:
                self._state[engine] = reason
                # No socket at all is how a host without this engine looks: said, not warned.
                say = log.info if isinstance(e, FileNotFoundError) else log.warning
                say(
                    "container_names_unavailable",
                    engine=engine,
                    socket=path,
                    error=reason,
                    detail=f"{engine} containers are shown by short ID; asking again in {self.retry_after:g} s",
                )
            return ""
        if self._state.get(engine) != "ok":
            if engine in self._state:
                log.info("container_names_available", engine=engine, socket=path)
            self._state[engine] = "ok"
        if name:
            self._names[key] = name
            if len(self._names) > self.cache_size:
                self._names.popitem(last=False)
        else:  # not this engine's, or gone: asked again after a while, not on every poll
            if len(self._unknown) >= self.cache_size:
                self._unknown.clear()
            self._unknown[key] = now + self.retry_after
        return name
