"""structlog setup: JSON lines for machines, readable lines on a terminal, written without ever
making the daemon wait.

Log lines go through a bounded queue to a thread of their own that writes them to stderr.  A
reader that stops reading (``gpu-exporter 2>&1 | sleep 1000``, a stuck log shipper) then blocks
that thread alone: a poll, a scrape or a shutdown that logs never waits on the pipe, and no lock
of structlog or ``logging`` is held across the write.  When the queue is full, new lines are
dropped and counted (``gpu_exporter_log_lines_dropped_total``), and the writer says how many once
the reader is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections import deque
from typing import IO, Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
QUEUE_LINES = 4096  # ~1 MB of typical lines: minutes of a noisy daemon, and a bound on memory
MAX_LINE = 16 * 1024  # a longer line is cut: no single message may hold the queue


class LogPipe:
    """A file-like object whose ``write`` never blocks: lines queue up for a writer thread."""

    def __init__(self, fd: int | None, capacity: int = QUEUE_LINES) -> None:
        # None: stderr has no file descriptor (closed, or a test's capture): lines are written to
        # whatever ``sys.stderr`` is then, as they come, or dropped where there is none.
        self._fd = fd
        self._capacity = capacity
        self._queue: deque[str] = deque()
        self._cond = threading.Condition()
        self._pending = ""
        self.dropped = 0  # lines dropped since start (exported as a counter)
        self._dropped_unsaid = 0
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    # -- the file-like side ---------------------------------------------------------------------
    def write(self, text: str) -> int:
        """Queue ``text``; whole lines go out, a partial one waits for its end."""
        data = self._pending + text
        *lines, self._pending = data.split("\n")
        if len(self._pending) > MAX_LINE:
            lines.append(self._pending)
            self._pending = ""
        if lines:
            self._put(lines)
        return len(text)

    def flush(self) -> None:
        """Nothing to do: the writer thread writes as fast as the reader reads."""

    def isatty(self) -> bool:
        return False

    def _put(self, lines: list[str]) -> None:
        if self._fd is None:
            stream = sys.stderr
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.write("".join(line[:MAX_LINE] + "\n" for line in lines))
            return
        with self._cond:
            for line in lines:
                if len(self._queue) >= self._capacity:
                    self.dropped += 1
                    self._dropped_unsaid += 1
                    continue
                self._queue.append(line[:MAX_LINE] + "\n")
            self._idle.clear()
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
                self._thread.start()

    # -- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        assert self._fd is not None
        while True:
            with self._cond:
                while not self._queue:
                    self._idle.set()
                    self._cond.wait()
                batch = "".join(self._queue)
                self._queue.clear()
                unsaid, self._dropped_unsaid = self._dropped_unsaid, 0
            if unsaid:
                batch += f'{{"event": "log_lines_dropped", "level": "warning", "lines": {unsaid}, ' \
                         f'"reason": "the reader of the log did not keep up"}}\n'  # fmt: skip
            data = batch.encode("utf-8", "replace")
            try:
                while data:
                    data = data[os.write(self._fd, data) :]
            except OSError:  # the reader is gone for good (EPIPE, EBADF): nothing more can be said
                with self._cond:
                    self._queue.clear()
                    self._capacity = 0  # from now on every line is dropped, and counted
                    self._idle.set()
                return

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queue to be written; False if the reader is stuck."""
        return self._idle.wait(timeout)


_pipe: LogPipe | None = None


def dropped_lines() -> int:
    """Log lines dropped because the reader of stderr did not keep up."""
    return _pipe.dropped if _pipe is not None else 0


def drain(timeout: float = 1.0) -> bool:
    """Give the log writer ``timeout`` seconds to write what is queued (at exit); never blocks longer."""
    return _pipe.drain(timeout) if _pipe is not None else True


def _isatty(stream: IO[Any] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # closed
        return False


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno() if sys.stderr is not None else None
    except (OSError, ValueError, AttributeError):
        return None


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    global _pipe
    # Logs go to stderr; readable lines only when a person is watching both streams.
    json_lines = fmt == "json" or (fmt == "auto" and not (_isatty(sys.stdout) and _isatty(sys.stderr)))
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    )
    if _pipe is None:
        _pipe = LogPipe(_stderr_fd())
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=_pipe),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # apscheduler logs a warning each time a poll is skipped because the previous one overran;
    # the poll-duration histogram already shows that, without a line per interval.
    root = logging.getLogger()
    for handler in root.handlers[:]:
        with contextlib.suppress(Exception):
            root.removeHandler(handler)
    handler = logging.StreamHandler(_pipe)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
