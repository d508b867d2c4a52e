"""Counting what one piece of code allocates, with tracemalloc, whatever else the test run is doing.

tracemalloc counts the allocations of every thread in the process.  Earlier tests in a full run
leave daemon threads behind (a fake server's accept loop, a watcher waiting out its interval, a
log handler), and one of them allocating while a window was being measured showed up in CI as
7 KB of "growth" in a window that had not grown.  So:

- sizes are summed over the traces whose allocating frame lies in the files named (the code under
  test), not over the whole process;
- where a process-wide *peak* is wanted, the block runs ``alone``: with a thread switch interval
  of a minute, so no other Python thread runs while it does (they wait for the GIL).  Only for
  pure computation: a block that blocks (I/O, a lock) would let another thread in and could then
  wait up to that minute for the GIL back.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


class Allocations:
    def __init__(self, modules: tuple[ModuleType, ...]) -> None:
        self._filters = [tracemalloc.Filter(True, _source_pattern(m)) for m in modules]

    def held(self) -> int:
        """Bytes held now by blocks that the named modules' code allocated since the block began."""
        snapshot = tracemalloc.take_snapshot().filter_traces(self._filters)
        return sum(stat.size for stat in snapshot.statistics("filename"))

    @staticmethod
    def reset_peak() -> None:
        tracemalloc.reset_peak()

    @staticmethod
    def peak_since_reset(base: int) -> int:
        """The process's peak of traced memory since ``reset_peak``, above ``base`` (a reading of
        ``traced()``).  Meaningful only in a block run ``alone``."""
        return tracemalloc.get_traced_memory()[1] - base

    @staticmethod
    def traced() -> int:
        return tracemalloc.get_traced_memory()[0]


def _source_pattern(module: ModuleType) -> str:
    path = module.__file__
    assert path is not None, module
    # A package stands for every file under it (fnmatch's * crosses "/").
    return path.rsplit("/", 1)[0] + "/*" if path.endswith("/__init__.py") else path


@contextmanager
def allocations(*modules: ModuleType, alone: bool = False) -> Iterator[Allocations]:
    """Trace allocations while the block runs, counting those made by ``modules``' code."""
    interval = sys.getswitchinterval()
    if alone:
        sys.setswitchinterval(60.0)
        # A thread already waiting for the GIL waits out the old interval, then asks for it: let
        # those take their turn now, so that from here on every wait is a minute long.
        time.sleep(0.02)
    tracemalloc.start()
    try:
        yield Allocations(modules)
    finally:
        tracemalloc.stop()
        sys.setswitchinterval(interval)
