"""The web config in force: reloaded when the file or a certificate it names changes, or on request.

A ``WebConfigWatcher`` checks the modification times at most once a second, when a connection or
request asks for the current config; a changed file that fails to load is logged and ignored,
keeping the last good configuration.  What a loaded config accepts but does not apply (its
``warnings``) is logged once per load.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import structlog

from .config import WebConfig, WebConfigError, load_web_config

log = structlog.get_logger(__name__)

_CHECK_EVERY_S = 1.0


class WebConfigWatcher:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._config = load_web_config(path)  # a broken file at start is the caller's exit 2
        self._stamps = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        _warn(self._config)

    def _stat(self) -> tuple[tuple[int, int], ...]:
        out = []
        for f in self._config.files:
            try:
                st = os.stat(f)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((-1, -1))
        return tuple(out)

    def current(self) -> WebConfig:
        now = time.monotonic()
        if self.path is None or now - self._checked < _CHECK_EVERY_S:
            return self._config
        with self._lock:
            if now - self._checked < _CHECK_EVERY_S:
                return self._config
            self._checked = now
            stamps = self._stat()
            if stamps != self._stamps:
                self._stamps = stamps
                try:
                    self._config = load_web_config(self.path)
                    self._stamps = self._stat()
                    log.info("web_config_reloaded", path=str(self.path))
                    _warn(self._config)
                except WebConfigError as e:
                    log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
            return self._config

    def install(self, path: Path | None, config: WebConfig) -> None:
        """Use ``config``, loaded from ``path``, from now on (a reload on SIGHUP)."""
        with self._lock:
            self.path = path
            self._config = config
            self._stamps = self._stat()
            self._checked = time.monotonic()
        _warn(config)


def _warn(config: WebConfig) -> None:
    for warning in config.warnings:
        log.warning("web_config_not_applied", warning=warning)
