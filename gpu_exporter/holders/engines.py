"""Container names from the engines' API sockets: Docker's, and Podman's Docker-compatible one.

The cgroup path gives a container's ID, not its name.  Where an engine's socket is configured and
readable, one ``GET /containers/<id>/json`` per container (the inspect call of ``docker inspect``)
gives the name; nothing else is ever asked, and nothing is written.  containerd and CRI-O speak
gRPC and have no such call: their containers are shown by short ID.

The cost is bounded on every side, and none of it is the poller's:

- the poller never waits for an engine beyond ``budget`` seconds in all per poll (:meth:`lookup`
  only reads the cache and queues what it lacks; :meth:`settle` waits for this poll's new
  containers at most that long).  One worker thread asks the engines, one call at a time, for at
  most ``MAX_PENDING`` containers queued or being asked (more are queued at a later poll): a hung engine holds
  that one thread, never the poller, and never piles up threads.  Until a name comes, the
  container is shown by its short ID;
- a name is asked once per container and cached (at most ``cache_size`` containers, the least
  recently used leaving first), so a poll asks nothing once its containers are known;
- a call takes at most ``timeout`` seconds, whatever the engine does (no answer, an answer dripped
  a byte at a time); the answer is read to at most 1 MiB;
- an engine whose socket is missing, refuses, fails or times out is not asked again for
  ``retry_after`` seconds: its containers are shown by short ID meanwhile, and a hung engine costs
  the worker one ``timeout`` per ``retry_after``.

**The engine vouches for the cgroup.**  The answer also carries the container's init process
(``State.Pid``); the cgroup that process runs in (read under ``proc_root`` as the worker gets the
answer) is cached with the name.  A process claims a container by its cgroup path; the claim holds
only where its path, down to the container's own cgroup, is the init process's (:meth:`Known.holds`):
a cgroup named after another container, made inside a container that may write its own cgroupfs,
is refused.  An engine that does not know the ID (404: a container of a nested engine) or does not
answer cannot vouch, and the path stands alone.

A name is the engine's answer, and a container's name is chosen by whoever started it: it is
decoded leniently and cut to 128 characters here, escaped wherever it is shown.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from .. import untrusted
from . import cgroups

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 1.0
DEFAULT_RETRY_AFTER_S = 60.0
DEFAULT_CACHE_SIZE = 1024
DEFAULT_BUDGET_S = 0.25  # the most a poll waits for names, in all: a local engine answers in milliseconds
MAX_PENDING = 256  # containers queued for the worker or being asked; more wait for a later poll
MAX_ANSWER_BYTES = 1024 * 1024
MAX_NAME_CHARS = 128
# The engines that answer Docker's inspect call on their socket.
API_ENGINES = ("docker", "podman")
_ID = re.compile(r"[0-9a-f]{64}")
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})[ \r]")


class EngineError(Exception):
    """The engine did not answer as it should; the message says how."""


@dataclass(frozen=True, slots=True)
class Inspected:
    """What the inspect call says of a container: its name ("" where the engine does not know it)
    and its init process (0 where not running or not said)."""

    name: str
    pid: int = 0


def inspect(socket_path: str, container_id: str, timeout: float) -> Inspected:
    """``GET /containers/<id>/json`` on an engine's socket; an empty name where the engine does not
    know the container.  Raises EngineError (or OSError) on anything else."""
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
        return Inspected("")  # gone already, or not this engine's
    if code != 200:
        raise EngineError(f"HTTP status {code}")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise EngineError(f"an answer that is not JSON ({e.__class__.__name__})") from e
    name = doc.get("Name") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise EngineError("an answer without a Name")
    state = doc.get("State")
    pid = state.get("Pid") if isinstance(state, dict) else None
    # bool is an int to Python; a pid is a positive int and nothing else.
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31 else 0
    return Inspected(untrusted.text(name).lstrip("/")[:MAX_NAME_CHARS], pid)


def inspect_name(socket_path: str, container_id: str, timeout: float) -> str:
    """The name of a container (:func:`inspect`); "" where the engine does not know it."""
    return inspect(socket_path, container_id, timeout).name


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


@dataclass(frozen=True, slots=True)
class Known:
    """A container the engine answered for: its name, and the cgroup path of its init process down
    to the container's own (None where that process could not be read or was not given)."""

    name: str
    cgroup: str | None

    def holds(self, facts: cgroups.CgroupFacts) -> bool:
        """Whether the engine vouches for a process's claim to be in this container: its path down
        to the container's cgroup is the init process's."""
        return self.cgroup is not None and facts.container_cgroup == self.cgroup


Key = tuple[str, str]  # (engine, container ID)


class EngineNames:
    """Container names by engine and ID, from the engines' sockets (see the module).

    :meth:`lookup` and :meth:`settle` are the poller's (never blocking beyond the budget);
    :meth:`name` asks on the caller's thread, as the worker does.
    """

    def __init__(
        self,
        sockets: Mapping[str, str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_after: float = DEFAULT_RETRY_AFTER_S,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        ask: Callable[[str, str, float], Inspected] = inspect,
        proc_root: str = "/proc",
    ) -> None:
        self.sockets = {engine: path for engine, path in sockets.items() if engine in API_ENGINES and path}
        self.timeout = timeout
        self.retry_after = retry_after
        self.cache_size = cache_size
        self.proc_root = proc_root
        self._clock = clock
        self._ask = ask
        self._names: OrderedDict[Key, Known] = OrderedDict()
        self._down_until: dict[str, float] = {}
        self._unknown: dict[Key, float] = {}  # containers the engine did not know -> ask again at
        self._state: dict[str, str] = {}  # engine -> "ok" or the last failure, to log changes only
        self.errors = 0  # failed calls, for the exporter's own metrics
        # The worker's: the queue, the keys in it or being asked, and one lock over all of the above.
        self._lock = threading.Condition()
        self._queue: deque[Key] = deque()
        self._pending: set[Key] = set()
        self._worker: threading.Thread | None = None
        self._closed = False

    # -- the poller's side: never waits on an engine ------------------------------------------------

    def lookup(self, engine: str, container_id: str) -> Known | None:
        """The container as the engine last answered, from the cache; None where not known yet, in
        which case it is queued for the worker (where its engine has a socket and may be asked)."""
        key = (engine, container_id)
        with self._lock:
            known = self._names.get(key)
            if known is not None:
                self._names.move_to_end(key)
                return known
            if key in self._pending or self._closed or not self._may_ask(key) or len(self._pending) >= MAX_PENDING:
                return None
            self._pending.add(key)
            self._queue.append(key)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="engine-names", daemon=True)
                self._worker.start()
            self._lock.notify_all()
        return None

    def settle(self, keys: Iterable[Key], budget: float) -> None:
        """Wait until none of ``keys`` is still being asked, ``budget`` seconds at most in all."""
        wanted = set(keys)
        deadline = time.monotonic() + budget
        with self._lock:
            while wanted & self._pending and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._lock.wait(left)

    def close(self) -> None:
        """Stops the worker: what is queued is dropped; a call in progress ends within ``timeout``."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._pending.clear()
            self._lock.notify_all()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                key = self._queue.popleft()
            try:
                self._resolve(key)
            except Exception:  # a bug here must not end the worker: the poller would wait on nothing
                log.exception("container_name_lookup_failed", engine=key[0])
            finally:
                with self._lock:
                    self._pending.discard(key)
                    self._lock.notify_all()

    # -- asking ---------------------------------------------------------------------------------

    def name(self, engine: str, container_id: str) -> str:
        """The container's name, asked now on this thread where not cached; "" where it is not known
        (no socket, the engine is down, or it does not know the container)."""
        key = (engine, container_id)
        with self._lock:
            known = self._names.get(key)
            if known is not None:
                self._names.move_to_end(key)
                return known.name
        found = self._resolve(key)
        return found.name if found is not None else ""

    def _may_ask(self, key: Key) -> bool:
        now = self._clock()
        engine = key[0]
        up = now >= self._down_until.get(engine, now)
        return engine in self.sockets and up and now >= self._unknown.get(key, now)

    def _resolve(self, key: Key) -> Known | None:
        """Ask the engine about one container, unless its engine may not be asked now."""
        engine, container_id = key
        with self._lock:
            if not self._may_ask(key):
                return self._names.get(key)
        path = self.sockets[engine]
        now = self._clock()
        try:
            answer = self._ask(path, container_id, self.timeout)
        except (OSError, EngineError) as e:
            self._failed(engine, path, e)
            return None
        # The init process's cgroup now: it is the container's for as long as the container lives
        # (a restart keeps its cgroup), so it is cached with the name.
        known = Known(answer.name, self._cgroup_of(answer.pid, key)) if answer.name else None
        with self._lock:
            if self._state.get(engine) != "ok":
                if engine in self._state:
                    log.info("container_names_available", engine=engine, socket=path)
                self._state[engine] = "ok"
            if known is not None:
                self._names[key] = known
                self._names.move_to_end(key)
                if len(self._names) > self.cache_size:
                    self._names.popitem(last=False)
            else:  # not this engine's, or gone: asked again after a while, not on every poll
                if len(self._unknown) >= self.cache_size:
                    self._unknown.clear()
                self._unknown[key] = now + self.retry_after
        return known

    def _cgroup_of(self, pid: int, key: Key) -> str | None:
        if pid <= 0:
            return None
        facts = cgroups.read(pid, self.proc_root)
        return facts.container_cgroup if (facts.engine, facts.container_id) == key else None

    def _failed(self, engine: str, path: str, e: Exception) -> None:
        with self._lock:
            self.errors += 1
            self._down_until[engine] = self._clock() + self.retry_after
            reason = f"{type(e).__name__}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
            if self._state.get(engine) == reason:
                return
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
