"""Issue 38, item 4: a file a person names that is a named pipe, a device or huge never blocks or
bloats the daemon, `--once` or `report`.

Swapping the web config or a certificate for a FIFO hung /metrics and /healthz (read on the event
loop); `bearer_token_file` as a FIFO hung the daemon, which then ignored SIGTERM; a 512 MiB file took
RSS to 1 GiB, and /dev/zero ended in MemoryError.  Every such file is now read by
``yamlfile.read_bounded``: a regular file only, opened without blocking, read no further than its
bound.  Each check below runs in a thread: a read that blocks fails it at the deadline instead of
hanging the suite (the deadline only bounds a hang; the outcome decides).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from gpu_exporter.alerting.settings import WebhookSettings
from gpu_exporter.report.client import QueryError, _secret
from gpu_exporter.settings.config import ConfigError, load_settings
from gpu_exporter.settings.yamlfile import MAX_FILE_BYTES, read_bounded
from gpu_exporter.web.config import WebConfigError, load_web_config
from tests import assert_mentions
from tests.timing import NEVER_S
from tests.web_helpers import tls_files


def returns(call: Callable[[], Any]) -> BaseException | None:
    """What ``call`` raised (None if nothing), failing the test if it does not return at all."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as e:  # handed back to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(NEVER_S)
    assert out, "blocked: the read waited on the file instead of refusing it"
    return out[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_named_pipe_a_device_and_a_huge_file_are_refused_at_once(tmp_path: Path, fifo: Path) -> None:
    huge = tmp_path / "huge"
    with huge.open("wb") as f:
        f.truncate(512 * 2**20)  # sparse: 512 MiB that cost no disk, and would cost RSS if read
    for path, says in ((fifo, "a named pipe, not a regular file"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory"), (huge, f"larger than {MAX_FILE_BYTES} bytes")):  # fmt: skip
        e = returns(functools.partial(read_bounded, path))
        assert isinstance(e, OSError) and says in str(e.strerror), (path, e)
    small = tmp_path / "small"
    small.write_bytes(b"x" * MAX_FILE_BYTES)  # exactly the bound: read whole
    assert read_bounded(small) == b"x" * MAX_FILE_BYTES


def test_a_web_config_that_is_a_pipe_is_refused_naming_it(fifo: Path) -> None:
    e = returns(lambda: load_web_config(fifo))
    assert isinstance(e, WebConfigError)
    assert_mentions(str(e), str(fifo), "web config file", "named pipe")


def test_a_certificate_swapped_for_a_pipe_is_refused_naming_it(tmp_path: Path, fifo: Path) -> None:
    ca = trustme.CA()
    crt, key = tls_files(tmp_path, ca)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {fifo}\n  key_file: {key}\n")
    e = returns(lambda: load_web_config(web))
    assert isinstance(e, WebConfigError) and "named pipe" in str(e) and str(fifo) in str(e), e
    web.write_text(
        f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  client_ca_file: {fifo}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
    )
    e = returns(lambda: load_web_config(web))
    assert isinstance(e, WebConfigError) and "named pipe" in str(e) and str(fifo) in str(e), e
    web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    assert returns(lambda: load_web_config(web)) is None  # the real files still load


def test_a_secret_file_that_is_a_pipe_is_refused_by_the_daemon_and_the_report(tmp_path: Path, fifo: Path) -> None:
    e = returns(lambda: WebhookSettings(url="http://127.0.0.1:1/hook", bearer_token_file=fifo))
    assert e is not None and "named pipe" in str(e) and str(fifo) in str(e), e
    config = tmp_path / "config.yaml"
    config.write_text(f"alerting:\n  webhooks:\n    - url: http://127.0.0.1:1/hook\n      bearer_token_file: {fifo}\n")
    e = returns(lambda: load_settings(config_file=config))
    assert isinstance(e, ConfigError) and "named pipe" in str(e), e
    e = returns(lambda: _secret(fifo, "bearer token"))
    assert isinstance(e, QueryError) and "named pipe" in str(e) and str(fifo) in str(e), e
