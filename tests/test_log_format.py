"""``--log.format logfmt|json``, as Prometheus's exporters take it (issue 34, item 4).

logfmt lines are what promslog writes: ``time=... level=... msg=...`` first, then the event's keys;
a value is quoted and escaped wherever it could end the line or forge a key. Every line is in the
chosen format, those of the standard library's loggers (apscheduler, asyncio) and the writer's own
"lines dropped" line included. The old values (``auto``, ``json``, ``console``) keep working.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator

import pytest
import structlog

from gpu_exporter import logs
from gpu_exporter.cli import build_parser
from gpu_exporter.logs import LogPipe, configure_logging, render_logfmt
from gpu_exporter.settings.config import load_settings
from tests.timing import NEVER_S

# A logfmt line as go-logfmt reads it: key=value pairs, a value bare or quoted with \-escapes.
PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s="]*)(?: |$)')


def parse_logfmt(line: str) -> dict[str, str]:
    pairs = PAIR.findall(line)
    assert " ".join(f"{k}={v}" for k, v in pairs) == line, f"not logfmt: {line!r}"
    return {k: json.loads(v) if v.startswith('"') else v for k, v in pairs}


@pytest.fixture
def captured(capfd: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """stderr, with structlog and the root logger put back as they were for the other tests (a
    level configured here would filter the debug lines they capture)."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    render = logs._pipe.render if logs._pipe is not None else None
    yield capfd
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
    if logs._pipe is not None and render is not None:
        logs._pipe.render = render


def lines(capfd: pytest.CaptureFixture[str]) -> list[str]:
    assert logs.drain(NEVER_S)
    return [line for line in capfd.readouterr().err.splitlines() if line]


@pytest.mark.parametrize("fmt", ["auto", "logfmt", "json", "console"])
def test_every_format_is_a_flag_value_a_key_and_a_variable(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["--log.format", fmt]).log_format == fmt
    assert load_settings({"log_format": fmt}).log_format == fmt
    monkeypatch.setenv("GPU_EXPORTER_LOG_FORMAT", fmt)
    assert load_settings().log_format == fmt


def test_logfmt_lines_put_time_level_and_msg_first(captured: pytest.CaptureFixture[str]) -> None:
    configure_logging("logfmt")
    structlog.get_logger("t").warning("poll_overran", gpu=3, seconds=1.5, late=True, holder=None)
    [line] = lines(captured)
    assert re.fullmatch(r"time=\S+Z level=warning msg=poll_overran gpu=3 seconds=1.5 late=true holder=\"\"", line)
    assert parse_logfmt(line)["msg"] == "poll_overran"


@pytest.mark.parametrize(
    "value",
    ["two words", 'a "quoted" word', "key=forged", "line\nbreak", "carriage\rreturn", "tab\there",
     "\x1b[2Jescape", "back\\slash", "", "naïve ✓", "end\\"],
)  # fmt: skip
def test_a_logfmt_value_can_neither_end_the_line_nor_forge_a_key(value: str) -> None:
    line = render_logfmt(None, "", {"event": "x", "name": value, "after": "kept"})
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert parse_logfmt(line) == {"msg": "x", "name": value, "after": "kept"}


def test_a_logfmt_value_that_is_a_list_or_mapping_is_json() -> None:
    line = render_logfmt(None, "", {"event": "x", "codes": [79, 48], "by": {"a": 1}})
    fields = parse_logfmt(line)
    assert json.loads(fields["codes"]) == [79, 48] and json.loads(fields["by"]) == {"a": 1}


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_the_standard_librarys_loggers_write_in_the_same_format(fmt: str, captured: pytest.CaptureFixture[str]) -> None:
    configure_logging(fmt)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("apscheduler.scheduler").exception("Job %s raised", "poll")
    [line] = lines(captured)
    fields = parse_logfmt(line) if fmt == "logfmt" else json.loads(line)
    message = fields["msg"] if fmt == "logfmt" else fields["event"]
    assert message == "Job poll raised" and fields["level"] == "error"
    assert fields["logger"] == "apscheduler.scheduler" and "ValueError: boom" in fields["exception"]


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_the_lines_dropped_line_is_in_the_same_format(fmt: str) -> None:
    read_fd, write_fd = os.pipe()
    try:
        pipe = LogPipe(write_fd, capacity=1)
        pipe.render = (lambda e: render_logfmt(None, "", e)) if fmt == "logfmt" else pipe.render
        with pipe._cond:  # the writer cannot take the queue: the second and third lines are dropped
            pipe.write("first\n")
            pipe.write("second\nthird\n")
        assert pipe.drain(NEVER_S)
        out = b""
        while out.count(b"\n") < 2:
            out += os.read(read_fd, 65536)
        first, said = out.decode().splitlines()
        assert first == "first"
        fields = parse_logfmt(said) if fmt == "logfmt" else json.loads(said)
        assert fields[{"logfmt": "msg", "json": "event"}[fmt]] == "log_lines_dropped"
        assert str(fields["lines"]) == "2"
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_the_json_lines_are_as_before(captured: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    structlog.get_logger("t").info("listening", port=9445)
    [line] = lines(captured)
    entry = json.loads(line)
    assert entry["event"] == "listening" and entry["level"] == "info" and entry["port"] == 9445
    assert entry["timestamp"].endswith("Z")
