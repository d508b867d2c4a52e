"""The web config in force: reloaded when the file or a certificate it names changes, or on request.

A ``WebConfigWatcher`` looks at its files at most once a second, when a connection or request asks
for the current config; a changed file that fails to load is logged and ignored, keeping the last
good configuration.  The daemon has the look and the read done off the event loop (``run`` is a
thread): a request is answered with the config in force while a file on a slow or hung filesystem
is read, and the config read is in force from the next request on.  One look runs at a time.
What a loaded config accepts but does not apply (its ``warnings``) is logged once per load.

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


def inline(check: Callable[[], None]) -> None:
    """Runs a look at once, in the caller's thread: a request waits for a changed file's read."""
    check()


def in_thread(check: Callable[[], None]) -> None:
    """Runs a look in a thread of its own, so that the caller (the event loop) never waits on a file."""
    threading.Thread(target=check, name="web-config-reload", daemon=True).start()


class WebConfigWatcher:
    def __init__(
        self,
        path: Path | None,
        clock: Callable[[], float] = time.monotonic,
        run: Callable[[Callable[[], None]], None] = inline,
    ) -> None:
        self.path = path
        self._clock = clock
        self._run = run
        loaded = _read(path, ())  # a broken file at start is the caller's exit 2
        self._config, self._stamps = loaded.config, loaded.stamps
        self._checked = clock()
        self._lock = threading.Lock()
        self._looking = False
        self._installs = 0  # a look that began before an install must not undo it
        _warn(self._config)

    def read(self, path: Path | None) -> Loaded:
        """The web config at ``path`` (WebConfigError names what is wrong with it), for ``install``."""
        return _read(path, self._config.files)

    def current(self) -> WebConfig:
        if self.path is None:
            return self._config
        with self._lock:
            now = self._clock()
            path = self.path
            # abs(): a clock that steps back must not hold off reloads until it has caught up again.
            if path is None or self._looking or abs(now - self._checked) < _CHECK_EVERY_S:
                return self._config
            self._checked = now
            self._looking = True
            config, stamps, installs = self._config, self._stamps, self._installs
        try:
            self._run(lambda: self._look(path, config, stamps, installs))
        except RuntimeError as e:  # no thread to be had: the config in force stays, the next second tries again
            with self._lock:
                self._looking = False
            log.warning("web_config_reload_deferred", error=str(e))
        with self._lock:
            return self._config

    def _look(self, path: Path, config: WebConfig, known: Stamps, installs: int) -> None:
        try:
            stamps = _stat(config.files)
            if stamps == known:
                return
            with self._lock:
                if installs == self._installs:
                    self._stamps = stamps  # a file that fails to load is tried again when it changes again
            try:
                loaded = _read(path, config.files)
            except WebConfigError as e:
                log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
                return
            with self._lock:
                if installs != self._installs:
                    return  # a SIGHUP installed another config while this one was read
                self._config, self._stamps = loaded.config, loaded.stamps
            log.info("web_config_reloaded", path=str(path))
            _warn(loaded.config)
        finally:
            with self._lock:
                self._looking = False

    def install(self, path: Path | None, loaded: Loaded) -> None:
        """Use ``loaded`` (from ``read(path)``) from now on: a reload on SIGHUP."""
        with self._lock:
            self.path = path
            self._config, self._stamps = loaded.config, loaded.stamps
            self._checked = self._clock()
            self._installs += 1
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
