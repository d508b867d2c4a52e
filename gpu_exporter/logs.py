"""structlog setup: JSON lines for machines, readable lines on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    # Logs go to stderr; readable lines only when a person is watching both streams.
    json_lines = fmt == "json" or (fmt == "auto" and not (sys.stdout.isatty() and sys.stderr.isatty()))
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # apscheduler logs a warning each time a poll is skipped because the previous one overran;
    # the poll-duration histogram already shows that, without a line per interval.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
