"""The web config in force: reloaded when the file or a certificate it names changes, or on request.

A ``WebConfigWatcher`` looks at its files at most once a second, when a connection or request asks
for the current config; a changed file that fails to load is logged and ignored, keeping the last
good configuration.  What a loaded config accepts but does not apply (its ``warnings``) is logged
once per load.

A file is known by its stamp: modification and change times, size and inode.  The change time
cannot be set back (``cp -p`` and ``rsync -t`` keep the modification time of a certificate renewed
at the same size) and a file replaced by a rename (Kubernetes' ``..data`` swap) has a new inode.
The files known before a read (the web config itself, and those the config in force names) are
stamped before it: a write that lands while the read runs is seen at the next check, instead of
being taken for what was just loaded.  A certificate only the new config names is stamped after.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from .config import WebConfig, WebConfigError, load_web_config

log = structlog.get_logger(__name__)

_CHECK_EVERY_S = 1.0
# file -> (st_mtime_ns, st_ctime_ns, st_size, st_ino), for the files that can be read: one that
# cannot is left out, so that its going and its coming back are both a change.
Stamps = dict[Path, tuple[int, int, int, int]]


@dataclass(frozen=True)
class Loaded:
    """A web config as read, and the stamps of its files from before the read where they were known."""

    config: WebConfig
    stamps: Stamps


class WebConfigWatcher:
    def __init__(self, path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        loaded = _read(path, ())  # a broken file at start is the caller's exit 2
        self._config, self._stamps = loaded.config, loaded.stamps
        self._checked = clock()
        self._lock = threading.Lock()
        _warn(self._config)

    def read(self, path: Path | None) -> Loaded:
        """The web config at ``path`` (WebConfigError names what is wrong with it), for ``install``."""
        return _read(path, self._config.files)

    def current(self) -> WebConfig:
        if self.path is None:
            return self._config
        with self._lock:
            now = self._clock()
            # abs(): a clock that steps back must not hold off reloads until it has caught up again.
            if abs(now - self._checked) < _CHECK_EVERY_S:
                return self._config
            self._checked = now
            stamps = _stat(self._config.files)
            if stamps != self._stamps:
                self._stamps = stamps  # a file that fails to load is tried again when it changes again
                try:
                    loaded = _read(self.path, self._config.files)
                except WebConfigError as e:
                    log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
                    return self._config
                self._config, self._stamps = loaded.config, loaded.stamps
                log.info("web_config_reloaded", path=str(self.path))
                _warn(self._config)
            return self._config

    def install(self, path: Path | None, loaded: Loaded) -> None:
        """Use ``loaded`` (from ``read(path)``) from now on: a reload on SIGHUP."""
        with self._lock:
            self.path = path
            self._config, self._stamps = loaded.config, loaded.stamps
            self._checked = self._clock()
        _warn(loaded.config)


def _read(path: Path | None, known: Sequence[Path]) -> Loaded:
    before = _stat([*([path] if path is not None else []), *known])
    config = load_web_config(path)
    return Loaded(config, {f: before.get(f, stamp) for f, stamp in _stat(config.files).items()})


def _stat(files: Sequence[Path]) -> Stamps:
    out: Stamps = {}
    for f in files:
        with contextlib.suppress(OSError):
            st = os.stat(f)
            out[f] = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    return out


def _warn(config: WebConfig) -> None:
    for warning in config.warnings:
        log.warning("web_config_not_applied", warning=warning)
