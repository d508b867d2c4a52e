"""Shared fixtures: the fake NVML library, scenarios, and pynvml bound to them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.fakenvml import SCENARIO_ENV, Scenario, build_library, load_in_process
from tests.timing import NEVER_S


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The compiled fake ``libnvidia-ml.so.1`` (built once, cached by source hash)."""
    return build_library()


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    """An empty scenario at a fresh path; add GPUs, then ``write()`` it."""
    return Scenario(tmp_path / "node.scn")


@pytest.fixture
def nvml(fake_nvml_lib: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real pynvml module, in this process, talking to the fake library and ``scenario``.

    The test writes the scenario and calls ``nvmlInit`` itself; every init is undone afterwards.
    """
    load_in_process(fake_nvml_lib)
    monkeypatch.setenv(SCENARIO_ENV, str(scenario.path))
    import pynvml

    from gpu_exporter.sources.nvml import NvmlBackend

    # A backend a test leaves open keeps its XID thread waiting on the driver for the rest of the
    # run (each wake-up allocates, which disturbed tracemalloc measurements in later tests): close
    # every backend this test opened, as the daemon does when it stops.
    opened: list[NvmlBackend] = []
    real_open = NvmlBackend.open

    def open_and_remember(self: NvmlBackend) -> Any:
        opened.append(self)
        return real_open(self)

    monkeypatch.setattr(NvmlBackend, "open", open_and_remember)
    # The XID thread notices a stop only between two waits on the driver, and close() waits for it:
    # at the daemon's 500 ms that is up to half a second per test.  The fake answers a shorter wait
    # alike (an event due ends it at once, either way), so tests wait 20 ms.
    from gpu_exporter.sources.nvml import xid

    monkeypatch.setattr(xid, "WAIT_MS", 20)
    yield pynvml
    for backend in opened:
        backend.close()
    while True:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            break


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """A real running process whose PID a scenario can list as a GPU process."""
    proc = spawn_sleeper()
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def spawn_sleeper() -> subprocess.Popen[bytes]:
    """A sleeping Python process, returned once /proc shows its command line.

    Popen returns when exec has begun, slightly before the kernel fills in the new command line;
    a lookup in that window reads an empty one.
    """
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + NEVER_S
    while b"sleep" not in cmdline.read_bytes():
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"process {proc.pid} did not start")
        time.sleep(0.001)
    return proc


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A throwaway certificate authority for TLS tests."""
    return trustme.CA()


def pytest_report_header() -> list[str]:
    return [f"fake NVML build dir: {os.environ.get('FAKE_NVML_BUILD_DIR', 'tests/fakenvml/.build')}"]


# --- The fast tier (``--fast``) and its guard --------------------------------------------------
#
# ``pytest --fast`` runs the tests not marked ``integration``: the inner loop.  So that the marking
# cannot drift, a test left unmarked that starts what the integration tests start fails
# in such a run (``--fast``, or any ``-m`` that leaves out the integration tests), naming itself:
#
# - any other process: ``subprocess`` (and so asyncio's subprocesses), ``os.fork``, ``os.forkpty``,
#   ``os.posix_spawn[p]``, ``os.system`` and multiprocessing's spawn/forkserver;
# - a listening socket on an address other than loopback (127.0.0.0/8, ::1) or a Unix socket.
#
# Allowed, as measured cheap (milliseconds) and used by hundreds of unit tests: servers in this
# process, on threads or asyncio, listening on loopback or a Unix socket (the web server, the gRPC
# fake kubelet, hand-written hostile peers); compiling the fake NVML library (tests/fakenvml/build.py,
# cached by source hash); and ``spawn_sleeper`` above, a sleeping process that stands in for a GPU
# process (2 ms, killed at teardown).  The rule is in docs/development.md, "Tests".

INTEGRATION_WHY = "mark it integration (pytestmark = pytest.mark.integration at the top of its file)"


class StartsAProcess(Exception):
    """An unmarked test started a process or a server in a run of the fast tier."""


class _Guard:
    """The unmarked test running now (when the guard is on), and what it did that it must not."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.violations: list[str] = []

    def check(self, what: str) -> None:
        if self.test is None or _allowed_caller():
            return
        message = f"{self.test} {what[:300]}: {INTEGRATION_WHY}, or run it without --fast"
        self.violations.append(message)
        raise StartsAProcess(message)


_GUARD = _Guard()
_GUARD_ON = pytest.StashKey[bool]()
_ALLOWED_FILES = {str(Path(__file__).parent / "fakenvml" / "build.py")}
_ALLOWED_CODE = {spawn_sleeper.__code__}


def _allowed_caller() -> bool:
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _ALLOWED_CODE or frame.f_code.co_filename in _ALLOWED_FILES:
            return True
        frame = frame.f_back
    return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the inner loop: leaves out the tests marked integration or slow (adds 'not integration and "
        "not slow' to -m) and tries a tenth of the Hypothesis examples; any test left in that starts a "
        "process or a non-loopback server fails",
    )


def _deselects_integration(markexpr: str) -> bool:
    """Whether ``-m markexpr`` leaves out a test marked only ``integration`` and keeps an unmarked one."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression

    def unmarked(name: str, /, **kwargs: str | int | bool | None) -> bool:
        return False

    def integration_only(name: str, /, **kwargs: str | int | bool | None) -> bool:
        return name == "integration" and not kwargs

    expression = Expression.compile(markexpr)
    return expression.evaluate(unmarked) and not expression.evaluate(integration_only)


def pytest_configure(config: pytest.Config) -> None:
    markexpr = config.option.markexpr
    if config.getoption("fast"):
        left_out = "not integration and not slow"
        config.option.markexpr = f"({markexpr}) and {left_out}" if markexpr else left_out
        # A tenth of the Hypothesis examples (tests/hypothesis_budget.py), unless a profile is named.
        if config.getoption("hypothesis_profile", None) is None:
            from hypothesis import settings

            from tests.hypothesis_budget import FAST

            settings.load_profile(FAST)
    config.stash[_GUARD_ON] = config.getoption("fast") or _deselects_integration(markexpr)
    if config.stash[_GUARD_ON]:
        _install_guard()


def _install_guard() -> None:
    import _posixsubprocess
    import ipaddress
    import socket

    real_popen_init = subprocess.Popen.__init__

    def popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        _GUARD.check(f"started a process ({args!r})")
        real_popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]

    def guarded(module: Any, name: str) -> None:
        real = getattr(module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _GUARD.check(f"started a process ({module.__name__}.{name}{args!r})")
            return real(*args, **kwargs)

        setattr(module, name, call)

    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            guarded(os, name)
    guarded(_posixsubprocess, "fork_exec")  # multiprocessing's spawn and forkserver (subprocess bound it)

    real_listen = socket.socket.listen

    def listen(self: socket.socket, *args: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = self.getsockname()[0]
            if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
                _GUARD.check(f"listened on {host} (loopback and Unix sockets only)")
        elif self.family != socket.AF_UNIX:
            _GUARD.check(f"listened on a {self.family!r} socket")
        real_listen(self, *args)

    socket.socket.listen = listen  # type: ignore[assignment,method-assign]


def _guarded(item: pytest.Item) -> Iterator[None]:
    """One phase of ``item`` (setup, call or teardown), with the guard on unless it is integration."""
    if not item.config.stash[_GUARD_ON] or item.get_closest_marker("integration") is not None:
        yield
        return
    _GUARD.test, _GUARD.violations = item.nodeid, []
    try:
        yield
    finally:
        _GUARD.test = None
    if _GUARD.violations:  # the test (or the code under test) caught the error: still a failure
        pytest.fail("\n".join(_GUARD.violations), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _guarded(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from _guarded(item)


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every uid can traverse (pytest's own tmp dirs are under a root-only
    /tmp/pytest-of-root), for tests that act as another user."""
    path = Path(tempfile.mkdtemp(prefix="world-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
