"""The ``gpu-exporter`` command: the daemon, or ``--once`` for a single look."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic.fields import FieldInfo

from . import __version__
from .logs import configure_logging
from .logs import drain as drain_logs
from .settings.config import (
    COLLECTORS,
    DCGM_NAMES,
    SETTING_KEYS,
    CollectorSettings,
    ConfigError,
    Settings,
    load_settings,
)
from .settings.durations import format_duration, parse_duration
from .snapshot import NodeSnapshot
from .sources.backend import Backend, ErrorSink
from .sources.gpm import MIN_INTERVAL_S
from .web.config import WebConfigError

if TYPE_CHECKING:
    from .daemon import Daemon

log = structlog.get_logger(__name__)


def flag_key(flag: str) -> str:
    """A flag's key by the one naming rule, also its dest: ``--poll.gpu-timeout`` is ``poll_gpu_timeout``."""
    return flag.removeprefix("--").replace(".", "_").replace("-", "_")


# The flags that set a top-level setting, with the metavar each shows.  Each is its key by the rule
# (the dest is the key); its help and default are the field's, so a setting is described once.
_SETTING_FLAGS = {
    "--web.listen-address": "HOST:PORT", "--web.config.file": "PATH", "--web.max-requests": "N",
    "--poll.interval": "DURATION", "--profiling.interval": "DURATION", "--poll.static-refresh-interval": "DURATION",
    "--poll.gpu-timeout": "DURATION", "--poll.release-for": "DURATION", "--simulate": None, "--simulate.gpus": "N",
    "--poll.slow-interval": "DURATION",
    "--log.format": None, "--log.level": None, "--node.name": "NAME",
}  # fmt: skip
# flag dest -> config key: the same name, by the rule
_FLAGS = {flag_key(flag): flag_key(flag) for flag in _SETTING_FLAGS}
# The setting each flag sets -> the flag, so that a bad value's message names the flag it came from.
FLAG_OF: dict[tuple[str | int, ...], str] = {
    **{(flag_key(flag),): flag for flag in _SETTING_FLAGS},
    ("alerting", "alertmanagers"): "--alerting.alertmanager-url", ("alerting", "webhooks"): "--alerting.webhook-url",
    ("slurm", "job_mapping_dir"): DCGM_NAMES["slurm", "job_mapping_dir"][0],
    **{("collectors", name): f"--collector.{name}" for name in COLLECTORS},
}  # fmt: skip


def shown_default(field: FieldInfo) -> str:
    """A field's default as the user would write it: 5s, not 5.0; off, not False."""
    value = field.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if any(getattr(m, "func", None) is parse_duration for m in field.metadata):
        return format_duration(value)
    return str(value)


def _add_setting_flag(p: argparse.ArgumentParser, flag: str, metavar: str | None) -> None:
    field = Settings.model_fields[SETTING_KEYS[flag_key(flag)]]
    # argparse formats help with %: a literal one is doubled.
    help_text = f"{field.description} (default {shown_default(field)})".replace("%", "%%")
    kind: dict[str, Any] = {"metavar": metavar}
    if field.annotation is bool:
        kind = {"action": "store_const", "const": True, "default": None}
    elif typing.get_origin(field.annotation) is Literal:
        kind = {"choices": typing.get_args(field.annotation)}
    elif field.annotation is int:
        kind["type"] = int
    p.add_argument(flag, dest=flag_key(flag), help=help_text, **kind)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, keeping its last usage error for ``--once``'s status line."""

    last_error: str | None = None

    def error(self, message: str) -> typing.NoReturn:
        self.last_error = message
        super().error(message)


def _format_asked(argv: Sequence[str]) -> str | None:
    """``--format``'s value in arguments argparse refused (its last, as argparse would take)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--format" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--format="):
            found = arg.partition("=")[2]
    return found


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpu-exporter",
        description="Prometheus exporter and alerting daemon for NVIDIA GPUs.",
        epilog="`gpu-exporter report --help`: what the GPUs cost and wasted, from Prometheus. "
        "A flag --a.b-c is the key a_b_c of the --config YAML file and GPU_EXPORTER_A_B_C in the environment "
        "(--poll.gpu-timeout: poll_gpu_timeout: 10s, GPU_EXPORTER_POLL_GPU_TIMEOUT=10s); a nested key is "
        "GPU_EXPORTER_A__B (slurm.job_mapping_dir: GPU_EXPORTER_SLURM__JOB_MAPPING_DIR). Flags win over the "
        "environment, which wins over the file.",
    )
    p.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    p.add_argument("--config", type=Path, help="YAML settings file (or GPU_EXPORTER_CONFIG)")
    for flag, metavar in _SETTING_FLAGS.items():
        _add_setting_flag(p, flag, metavar)
    p.add_argument(
        "--alerting.alertmanager-url",
        dest="alertmanager_urls",
        action="append",
        metavar="URL",
        help="send alerts to this Alertmanager (repeatable; receiver options go in --config)",
    )
    p.add_argument(
        "--alerting.webhook-url",
        dest="webhook_urls",
        action="append",
        metavar="URL",
        help="send alerts to this webhook in Alertmanager's payload format (repeatable)",
    )
    flag, env = DCGM_NAMES["slurm", "job_mapping_dir"]
    p.add_argument(
        flag,
        dest="slurm_job_mapping_dir",
        metavar="DIR",
        help=f"dcgm-exporter's flag (and {env}) for slurm.job_mapping_dir: Slurm jobs from the files its prolog "
        "writes, one per GPU index",
    )
    for name in COLLECTORS:
        p.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action="store_const",
            const=True,
            default=None,
            help=f"collect {CollectorSettings.model_fields[name].description} (default on)",
        )
        p.add_argument(
            f"--no-collector.{name}",
            dest=f"collector_{name}",
            action="store_const",
            const=False,
            help="leave them out: no series, no NVML queries for them",
        )
    p.add_argument(
        "--once",
        action="store_true",
        help="take one snapshot, print it and exit as a monitoring check does: 0 OK, 1 WARNING, 2 CRITICAL "
        "(e.g. a lost GPU), 3 UNKNOWN (the GPUs or the configuration cannot be read)",
    )
    p.add_argument("--format", choices=["table", "json"], default="table", help="output of --once")
    return p  # fmt: skip


def settings_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags given set, nested as in the config file."""
    cli: dict[str, Any] = {key: v for dest, key in _FLAGS.items() if (v := getattr(args, dest)) is not None}
    if args.slurm_job_mapping_dir is not None:
        cli["slurm"] = {"job_mapping_dir": args.slurm_job_mapping_dir}
    collectors = {n: v for n in COLLECTORS if (v := getattr(args, f"collector_{n}")) is not None}
    if collectors:
        cli["collectors"] = collectors
    receivers = {"alertmanagers": args.alertmanager_urls, "webhooks": args.webhook_urls}
    alerting = {k: [{"url": u} for u in urls] for k, urls in receivers.items() if urls}
    if alerting:
        cli["alerting"] = alerting
    return cli


def make_backend(
    settings: Settings, errors: ErrorSink, profiling_interval: float | None = None, slow_interval: float | None = None
) -> Backend:
    if settings.simulate:
        from .alerting.engine import node_name
        from .sources.simulated import SimulatedBackend

        # The node's name as the daemon uses it (--node.name first): two simulated nodes, two sets of UUIDs.
        return SimulatedBackend(settings.simulate_gpus, node=node_name(settings.node_name))
    from .sources.nvml import NvmlBackend

    slow = settings.poll_slow_interval if slow_interval is None else slow_interval
    return NvmlBackend(errors, profiling_interval=profiling_interval or settings.profiling_interval,
                       disabled=settings.collectors.disabled(), slow_interval=slow,
                       poll_interval=settings.poll_interval)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:  # gpu-exporter report ...: cost and waste from Prometheus
        from .report.command import main as report

        return report(argv[1:])
    once = "--once" in argv
    parser = build_parser()
    assert isinstance(parser, _Parser)
    try:
        for arg in argv:
            m = re.fullmatch(r"--(?:no-)?collector\.([^=]*)(=.*)?", arg)
            if m and m.group(1) not in COLLECTORS:
                parser.error(f"unknown collector {m.group(1)!r} in {arg}; known: {', '.join(COLLECTORS)}")
            if m and m.group(2):
                parser.error(f"{arg}: collector flags take no value; use --collector.{m.group(1)} or "
                             f"--no-collector.{m.group(1)}")  # fmt: skip
        args = parser.parse_args(argv)
    except SystemExit as e:
        # argparse says what is wrong on stderr and exits 2; for a check, "cannot check" is UNKNOWN,
        # and its status line still comes first on stdout.
        if once and e.code == 2:
            fmt = "json" if _format_asked(argv) == "json" else "table"
            return once_unknown(parser.last_error or "invalid arguments", fmt, stderr=False)
        raise
    cli = settings_from_flags(args)
    config = args.config or (Path(os.environ["GPU_EXPORTER_CONFIG"]) if os.environ.get("GPU_EXPORTER_CONFIG") else None)
    try:
        settings = load_settings(cli, config, FLAG_OF)
    except ConfigError as e:
        if args.once:  # a check that cannot run is UNKNOWN, not CRITICAL: the GPUs may be fine
            return once_unknown(str(e), args.format)
        print(f"gpu-exporter: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_format, "warning" if args.once and settings.log_level == "info" else settings.log_level
    )
    try:
        settings = checked(settings)  # after the logging is set up: a doubtful key is logged as the rest
    except ConfigError as e:
        if args.once:
            return once_unknown(str(e), args.format)
        print(f"gpu-exporter: {e}", file=sys.stderr)
        return 2
    if args.once:
        return run_once(settings, args.format)
    return run_daemon(settings, lambda: checked(load_settings(cli, config, FLAG_OF)))


def checked(settings: Settings) -> Settings:
    """Settings whose pricing keys mean the same card to the daemon and the report (report.prices): a
    key that names a catalogue card but no GPU as NVML names it is refused, with the names it could
    mean; one of a known model that matches none of its names is logged."""
    if settings.pricing is None or not settings.pricing.models:
        return settings
    from .report.catalogue import load_catalogue  # only where there are model keys to check
    from .report.prices import key_problems

    refused, doubtful = key_problems(settings.pricing.models, load_catalogue())
    if refused:
        raise ConfigError("; ".join(refused))
    for said in doubtful:
        log.warning("pricing_key_matches_no_known_name", problem=said)
    return settings


SECOND_LOOK_S = 0.2
UNKNOWN_EXIT = 3  # gpu_exporter.once.UNKNOWN, without importing the rules for a usage error


def once_unknown(error: str, fmt: str, node: str | None = None, hint: str | None = None, *, stderr: bool = True) -> int:
    """``--once`` could not look: the reason on stderr, and on stdout the status line (table) or a
    JSON error object (json), so a check's first line of output says UNKNOWN and why; UNKNOWN."""
    from .alerting.engine import node_name
    from .once import UNKNOWN, error_json, unknown_line

    if stderr:  # argparse has said it there already
        print(f"gpu-exporter: {error}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    _print(error_json(error, node_name(node), time.time(), hint) if fmt == "json" else unknown_line(error))
    return UNKNOWN


def _print(text: str) -> bool:
    """Print, and let a reader that went away (``| head``) end the output quietly; False where there
    is no stdout to print to (closed), which leaves a check's answer UNKNOWN."""
    if sys.stdout is None:
        return False
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python would complain again flushing stdout at exit: point it at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # closed underneath us (EBADF)
        return False
    return True


def needs_second_look(snapshot: NodeSnapshot) -> bool:
    return any(g.up and g.static is not None and g.static.gpm_supported and g.activity is None for g in snapshot.gpus)


def run_once(settings: Settings, fmt: str) -> int:
    from .accounting.pricing import PriceBook
    from .alerting.engine import node_name
    from .once import as_json, as_table, cost_now, exit_status, findings
    from .polling import build_polling
    from .web.config import load_web_config

    try:
        load_web_config(settings.web_config_file)  # what the daemon would refuse, --once refuses too
    except WebConfigError as e:
        return once_unknown(str(e), fmt, settings.node_name)
    # One look takes its two GPM samples 200 ms apart (a MIG instance's too), whatever the daemon's
    # profiling and slow intervals; it joins Slurm jobs and containers as the daemon does, but asks
    # no kubelet for pods.
    polling = build_polling(settings, lambda errors: make_backend(settings, errors, profiling_interval=MIN_INTERVAL_S,
                                                                  slow_interval=0.0), pods=False)  # fmt: skip
    poller = polling.poller
    if polling.holders is not None:  # one look, no later poll to name them: wait as long as one lookup may take
        polling.holders.name_budget = settings.containers.api_timeout
    try:
        snapshot = poller.poll()
        if needs_second_look(snapshot):
            # GPM activity is a difference of two samples at least 100 ms apart, and per-process
            # utilization the driver's samples since the last look: take a second one.
            time.sleep(SECOND_LOOK_S)
            snapshot = poller.poll()
    finally:
        _close_without_waiting(poller.close)
    if not snapshot.nvml_up:
        return once_unknown(f"cannot read the GPUs: {snapshot.nvml_error}", fmt, settings.node_name,
                            "is the NVIDIA driver installed and loaded? To try the exporter without a GPU: "
                            "gpu-exporter --once --simulate")  # fmt: skip
    found = findings(snapshot, settings.rules)
    cost = cost_now(snapshot, settings.rules, PriceBook(settings.pricing) if settings.pricing else None)
    node = node_name(settings.node_name)
    if fmt == "json":
        text = as_json(snapshot, found, polling.render, cost, node)
    else:
        text = as_table(snapshot, found, cost, node)
    if not _print(text):
        return UNKNOWN_EXIT  # the answer could not be given: a check that cannot report is UNKNOWN
    return exit_status(found)


def _close_without_waiting(close: Callable[[], None], limit_s: float = 1.5) -> None:
    """Close NVML, but not wait for a driver call that hangs: the answer is already known."""
    closer = threading.Thread(target=close, name="close", daemon=True)
    closer.start()
    closer.join(limit_s)


def run_daemon(settings: Settings, reread: Callable[[], Settings] | None = None) -> int:
    """The daemon, until SIGTERM or SIGINT; SIGHUP applies ``reread()`` (the config file again)."""
    from .daemon import Daemon
    from .web.fds import raise_fd_limit

    # The handlers only set a flag and write a byte to a pipe: a handler runs between two bytecodes
    # of the main thread, also inside another handler, so one that took a lock (Event.set does)
    # could wait forever on a lock its own thread holds; a storm of SIGHUPs did exactly that.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    asked = {"stop": False, "hup": False}
    nvml: list[str] = []  # "release" or "resume", the later signal last

    def on_nvml(what: str) -> Callable[..., None]:
        def handler(*_: object) -> None:
            nvml.append(what)  # one bytecode: no lock a handler inside another could wait on
            with contextlib.suppress(OSError):
                os.write(wake_w, b"!")

        return handler

    def on_signal(what: str) -> Callable[..., None]:
        def handler(*_: object) -> None:
            asked[what] = True
            with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
                os.write(wake_w, b"!")

        return handler

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal("stop"))
    signal.signal(signal.SIGHUP, on_signal("hup"))  # by default SIGHUP would end the process
    # Let go of NVML and take it again (docs/troubleshooting.md): by default they too would end it.
    signal.signal(signal.SIGUSR1, on_nvml("release"))
    signal.signal(signal.SIGUSR2, on_nvml("resume"))
    # Each client costs a file descriptor; the soft limit (often 1024) is only a default.
    raise_fd_limit()
    try:
        daemon = Daemon(settings, lambda errors: make_backend(settings, errors))
    except WebConfigError as e:
        print(f"gpu-exporter: {e}", file=sys.stderr)
        return 2
    try:
        daemon.start()
    except OSError as e:
        print(f"gpu-exporter: cannot listen on {settings.web_listen_address}: {e.strerror or e}", file=sys.stderr)
        return 2
    while not asked["stop"]:
        os.read(wake_r, 4096)  # until a handler writes; PEP 475 retries the read after each signal
        if asked["hup"] and not asked["stop"]:
            asked["hup"] = False
            reload(daemon, reread)
        # Signals that came faster than this loop: the last handled decides, as it would have had
        # each been handled in turn.  (Two pending at the same instant carry no order: the kernel,
        # and Python after it, hand them over lowest number first.)
        if nvml and not asked["stop"]:
            n = len(nvml)
            latest = nvml[n - 1]
            del nvml[:n]  # not those a handler appended meanwhile
            if latest == "release":
                daemon.release_nvml()
            else:
                daemon.resume_nvml()
    daemon.stop()
    log.info("stopped")
    # A reader of the log that stopped reading gets a second to catch up, not the grace period.
    drain_logs(timeout=1.0)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or None
            stream.flush()
    # A GPU read stuck in the driver holds a worker thread that the interpreter would join at
    # exit; the stop must not wait for the driver.
    os._exit(0)


def reload(daemon: Daemon, reread: Callable[[], Settings] | None) -> None:
    """Read the configuration again and apply it; on any error, keep running as before and say why."""
    if reread is None:
        log.warning("config_reload_failed", error="no configuration to read again")
        daemon.reload_failed()
        return
    try:
        daemon.reload(reread())
        return
    except (ConfigError, WebConfigError) as e:
        log.error("config_reload_failed", error=str(e), keeping="the running configuration")
    except Exception as e:  # a reload must never take the daemon down
        log.exception("config_reload_failed", error=f"{type(e).__name__}: {e}", keeping="the running configuration")
    daemon.reload_failed()  # counted: gpu_exporter_config_reload_failures_total
