"""A slow container engine never slows polling: names are asked by one worker thread, a poll
waits for its new containers' names at most its budget in all, and shows them by short ID until
the names come; the queue is bounded, a hung engine holds one thread, and closing stops it.

The engine is a unix-socket server in this process that answers only when the test lets it
(``release``); a backstop lets it answer after a long while, so that code which waited for it is
caught by seeing its answer, never by a clock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpu_exporter.holders import engines
from gpu_exporter.holders.attribution import HolderAttributor
from gpu_exporter.holders.engines import EngineNames
from gpu_exporter.snapshot import ContainerRef, GpuReading, ProcessReading
from tests.test_engine_names import FakeEngine, http
from tests.timing import NEVER_S, wait_until

GIB = 1024**3
BACKSTOP_S = NEVER_S / 2  # the engine answers by itself after this: a poll that waited sees names


def cid(i: int) -> str:
    return f"{i:064x}"


class SlowEngine:
    """Docker's inspect answer for containers 0..n-1 (named c<i>, init pid 1000+i), each held until
    ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered = 0
        self.most_at_once = 0
        self._now = 0
        self._lock = threading.Lock()

    def answer(self, request: bytes) -> bytes:
        with self._lock:
            self._now += 1
            self.most_at_once = max(self.most_at_once, self._now)
        self.release.wait(BACKSTOP_S)
        with self._lock:
            self._now -= 1
            self.answered += 1
        i = int(request.split(b" ")[1].decode().removeprefix("/containers/").removesuffix("/json"), 16)
        return http("200 OK", json.dumps({"Name": f"/c{i}", "State": {"Pid": 1000 + i}}))


@contextmanager
def slow_engine(tmp_path: Path) -> Iterator[tuple[SlowEngine, FakeEngine]]:
    slow = SlowEngine()
    e = FakeEngine(tmp_path / "docker.sock", slow.answer)
    try:
        yield slow, e
    finally:
        slow.release.set()
        e.close()


def containers(root: Path, n: int) -> tuple[ProcessReading, ...]:
    """n containers, each with its init (pid 1000+i) on the GPU, under a test /proc."""
    procs = []
    for i in range(n):
        d = root / str(1000 + i)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(f"0::/system.slice/docker-{cid(i)}.scope\n")
        procs.append(ProcessReading(pid=1000 + i, name="python3", used_memory_bytes=GIB, user="alice"))
    return tuple(procs)


def gpu(procs: tuple[ProcessReading, ...]) -> GpuReading:
    return GpuReading(index=0, uuid="GPU-0", up=True, processes=procs)


def names_of(g: GpuReading) -> list[str]:
    return [p.container.display for p in g.processes if p.container is not None]


def attributor(root: Path, sock: Path, budget: float) -> tuple[HolderAttributor, EngineNames]:
    names = EngineNames({"docker": str(sock)}, timeout=NEVER_S, proc_root=str(root))
    return HolderAttributor(containers=True, names=names, proc_root=str(root), name_budget=budget), names


def test_a_poll_does_not_wait_for_a_slow_engine_and_names_come_later(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    procs = containers(root, 12)
    with slow_engine(tmp_path) as (slow, e):
        a, names = attributor(root, e.path, budget=0.05)
        (g,) = a.attach((gpu(procs),))
        assert slow.answered == 0  # the poll is back and the engine has not answered
        assert [p.container for p in g.processes] == [ContainerRef("docker", cid(i)) for i in range(12)]
        assert names_of(g) == [cid(i)[:12] for i in range(12)]  # shown by short ID meanwhile
        slow.release.set()
        assert wait_until(lambda: all(names.lookup("docker", cid(i)) for i in range(12))), "the names came"
        (g,) = a.attach((gpu(procs),))
        assert names_of(g) == [f"c{i}" for i in range(12)]
        assert slow.most_at_once == 1  # one worker, one call at a time: no thread per container
        a.close()


def test_a_poll_waits_for_its_new_containers_once_within_its_budget(tmp_path: Path) -> None:
    """A prompt engine names a new container in the same poll (--once depends on it); a container
    still nameless is not waited for again at the next poll."""
    root = tmp_path / "proc"
    procs = containers(root, 2)
    with slow_engine(tmp_path) as (slow, e):
        slow.release.set()  # prompt
        a, _ = attributor(root, e.path, budget=NEVER_S)
        (g,) = a.attach((gpu(procs[:1]),))
        assert names_of(g) == ["c0"]
        a.close()
    (tmp_path / "docker.sock").unlink()
    with slow_engine(tmp_path) as (slow, e):
        a, _ = attributor(root, e.path, budget=0.05)
        (g,) = a.attach((gpu(procs),))
        a.name_budget = NEVER_S  # were it waited for again, the backstop's answer would show
        (g,) = a.attach((gpu(procs),))
        assert slow.answered == 0 and names_of(g) == [cid(0)[:12], cid(1)[:12]]
        a.close()


def test_the_queue_is_bounded_and_the_rest_are_asked_at_a_later_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "MAX_PENDING", 3)
    root = tmp_path / "proc"
    procs = containers(root, 5)
    with slow_engine(tmp_path) as (slow, e):
        a, names = attributor(root, e.path, budget=0.0)
        (g,) = a.attach((gpu(procs),))  # 3 queued or being asked, 2 left for a later poll
        slow.release.set()
        assert wait_until(lambda: all(names.lookup("docker", cid(i)) for i in range(3)))
        assert slow.answered == 3
        a.name_budget = NEVER_S  # the next poll waits for none: they were all waited for once
        (g,) = a.attach((gpu(procs),))
        assert names_of(g) == ["c0", "c1", "c2", cid(3)[:12], cid(4)[:12]]  # asked in the poll's order
        # Answered is counted before the answer is sent: what matters is the name in the cache.
        assert wait_until(lambda: all(names.lookup("docker", cid(i)) for i in range(5)))
        (g,) = a.attach((gpu(procs),))
        assert names_of(g) == [f"c{i}" for i in range(5)] and len(e.requests) == 5
        a.close()


def test_closing_stops_the_worker_though_the_engine_hangs(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    procs = containers(root, 3)
    with slow_engine(tmp_path) as (slow, e):
        a, names = attributor(root, e.path, budget=0.0)
        a.attach((gpu(procs),))
        assert wait_until(lambda: len(e.requests) == 1)  # the worker is in the engine's hands
        worker = names._worker
        assert worker is not None
        a.close()
        slow.release.set()  # the call in progress ends; nothing queued is asked after it
        worker.join(NEVER_S)
        assert not worker.is_alive()
        assert [names.lookup("docker", cid(i)) is not None for i in range(3)] == [True, False, False]
        assert len(e.requests) == 1  # the call in progress only, and nothing asked after closing


def test_a_failing_lookup_does_not_end_the_worker(tmp_path: Path) -> None:
    calls: list[str] = []

    def ask(path: str, container_id: str, timeout: float) -> engines.Inspected:
        calls.append(container_id)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return engines.Inspected("ok")

    names = EngineNames({"docker": "/run/docker.sock"}, ask=ask, proc_root=str(tmp_path))
    try:
        assert names.lookup("docker", cid(0)) is None
        names.settle([("docker", cid(0))], NEVER_S)  # asked, and failed with a bug
        assert calls == [cid(0)]
        assert names.lookup("docker", cid(1)) is None
        assert wait_until(lambda: names.lookup("docker", cid(1)) == engines.Known("ok", None))
    finally:
        names.close()


def test_a_container_asked_about_is_not_queued_again_while_its_answer_is_awaited(tmp_path: Path) -> None:
    """One call per container: polls that see it while the engine is still answering add nothing."""
    root = tmp_path / "proc"
    procs = containers(root, 1)
    with slow_engine(tmp_path) as (slow, e):
        a, names = attributor(root, e.path, budget=0.01)
        for _ in range(5):
            a.attach((gpu(procs),))
            names.lookup("docker", cid(0))
        slow.release.set()
        assert wait_until(lambda: names.lookup("docker", cid(0)) is not None)
        assert slow.answered == 1
        a.close()
