"""The web config in force: reloaded when the file or a certificate it names changes, or on request.

A ``WebConfigWatcher`` checks the modification times at most once a second, when a connection or
request asks for the current config; a changed file that fails to load is logged and ignored,
keeping the last good configuration.  What a loaded config accepts but does not apply (its
``warnings``) is logged once per load.

A file is known by its modification time and size.  After a reload, a file both configs name keeps
the stamp seen before the reload read it: a write that lands while the reload runs is then seen at
the next check, instead of being taken for what was just loaded.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from .config import WebConfig, WebConfigError, load_web_config

log = structlog.get_logger(__name__)

_CHECK_EVERY_S = 1.0
# file -> (st_mtime_ns, st_size), for the files that can be read: one that cannot is left out, so that
# its going and its coming back are both a change.
Stamps = dict[Path, tuple[int, int]]


class WebConfigWatcher:
    def __init__(self, path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._config = load_web_config(path)  # a broken file at start is the caller's exit 2
        self._stamps = _stat(self._config.files)
        self._checked = clock()
        self._lock = threading.Lock()
        _warn(self._config)

    def current(self) -> WebConfig:
        if self.path is None:
            return self._config
        with self._lock:
            now = self._clock()
            # abs(): a clock that steps back must not hold off reloads until it has caught up again.
            if abs(now - self._checked) < _CHECK_EVERY_S:
                return self._config
            self._checked = now
            before = _stat(self._config.files)
            if before != self._stamps:
                self._stamps = before
                try:
                    config = load_web_config(self.path)
                except WebConfigError as e:
                    log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
                    return self._config
                self._stamps = {f: before.get(f, stamp) for f, stamp in _stat(config.files).items()}
                self._config = config
                log.info("web_config_reloaded", path=str(self.path))
                _warn(config)
            return self._config

    def install(self, path: Path | None, config: WebConfig) -> None:
        """Use ``config``, loaded from ``path``, from now on (a reload on SIGHUP)."""
        with self._lock:
            self.path = path
            self._config = config
            self._stamps = _stat(config.files)
            self._checked = self._clock()
        _warn(config)


def _stat(files: Sequence[Path]) -> Stamps:
    out: Stamps = {}
    for f in files:
        with contextlib.suppress(OSError):
            st = os.stat(f)
            out[f] = (st.st_mtime_ns, st.st_size)
    return out


def _warn(config: WebConfig) -> None:
    for warning in config.warnings:
        log.warning("web_config_not_applied", warning=warning)
