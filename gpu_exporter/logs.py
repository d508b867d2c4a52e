"""structlog setup: logfmt or JSON lines for machines (``--log.format``, as Prometheus's exporters
take it), readable lines on a terminal, written without ever making the daemon wait.

Log lines go through a bounded queue to a thread of their own that writes them to stderr.  A
reader that stops reading (``gpu-exporter 2>&1 | sleep 1000``, a stuck log shipper) then blocks
that thread alone: a poll, a scrape or a shutdown that logs never waits on the pipe, and no lock
of structlog or ``logging`` is held across the write.  When the queue is full, new lines are
dropped and counted (``gpu_exporter_log_lines_dropped_total``), and the writer says how many once
the reader is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
QUEUE_LINES = 4096  # ~1 MB of typical lines: minutes of a noisy daemon, and a bound on memory
MAX_LINE = 16 * 1024  # a longer line is cut: no single message may hold the queue
# --log.format: logfmt and json as Prometheus's exporters name them; console for people; auto (the
# default) is json, or console when both stdout and stderr are terminals.
FORMATS = ("auto", "logfmt", "json", "console")
_FIRST = {"timestamp": "time", "level": "level", "event": "msg"}  # logfmt's names, first on the line, as promslog's


def _logfmt_text(text: str) -> str:
    """A key or value as go-logfmt writes it: quoted when it holds a space, ``=``, ``"`` or a control
    character (or is empty), with ``\\``, ``"``, newlines, tabs and other control characters escaped,
    so that no value can end the line or forge a key."""
    if text and not any(c <= " " or c in '="\\' or c == "\x7f" for c in text):
        return text
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c < " " or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _logfmt_value(value: object) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        value = json.dumps(value, default=str, ensure_ascii=False)
    return _logfmt_text(str(value))


def render_logfmt(_logger: object, _name: str, event: Mapping[str, Any]) -> str:
    """One logfmt line: ``time=... level=... msg=...`` first, then the event's other keys in order."""
    first = [f"{name}={_logfmt_value(event[key])}" for key, name in _FIRST.items() if key in event]
    rest = [f"{_logfmt_text(str(k))}={_logfmt_value(v)}" for k, v in event.items() if k not in _FIRST]
    return " ".join(first + rest)


def render_json(_logger: object, _name: str, event: Mapping[str, Any]) -> str:
    return json.dumps(event, default=repr)


class _RecordFormatter(logging.Formatter):
    """Lines of the standard library's loggers (apscheduler, asyncio) in the format of the others."""

    def __init__(self, render: Callable[[object, str, Mapping[str, Any]], str]) -> None:
        super().__init__()
        self._render = render

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=UTC).isoformat().replace("+00:00", "Z")
        event: dict[str, Any] = {"timestamp": stamp, "level": record.levelname.lower(),
                                 "event": record.getMessage(), "logger": record.name}  # fmt: skip
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return self._render(None, "", event)


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
        # The line that says how many were dropped, in the format of the others.
        self.render: Callable[[Mapping[str, Any]], str] = lambda event: render_json(None, "", event)

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
                batch += self.render({"event": "log_lines_dropped", "level": "warning", "lines": unsaid,
                                      "reason": "the reader of the log did not keep up"}) + "\n"  # fmt: skip
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
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    # Logs go to stderr; readable lines only when a person is watching both streams.
    if fmt == "auto":
        fmt = "console" if _isatty(sys.stdout) and _isatty(sys.stderr) else "json"
    renderers: dict[str, structlog.typing.Processor] = {
        "json": structlog.processors.JSONRenderer(),
        "logfmt": render_logfmt,
        "console": structlog.dev.ConsoleRenderer(colors=False),
    }
    renderer = renderers[fmt]
    if _pipe is None:
        _pipe = LogPipe(_stderr_fd())
    line = render_logfmt if fmt == "logfmt" else render_json
    _pipe.render = lambda event: line(None, "", event)
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
    if fmt == "console":
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_RecordFormatter(line))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
