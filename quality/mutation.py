"""Mutation testing of the modules where a wrong result reaches users: how many small bugs the tests catch.

    .venv/bin/python quality/mutation.py                  # every module in TARGETS
    .venv/bin/python quality/mutation.py rules window     # some of them
    .venv/bin/python quality/mutation.py --check window   # fail on a survivor without a reason

Two passes, both on mutmut's mutants (see quality/README.md):

1. ``mutmut run`` in a scratch copy of the work tree (``quality/.work``), with mutmut's own test
   selection: each mutant re-runs only the in-process tests, out of the target's ``tests``, that
   called its function.
2. Each mutant that survived pass 1, or that no in-process test reached, is run against the
   target's ``daemon_tests``: tests that start the daemon (or ``--once``) as a subprocess, which
   pass 1 cannot attribute to a function.  The subprocess inherits ``MUTANT_UNDER_TEST`` and imports
   the mutated package first on its ``PYTHONPATH``.

Mutants that change nothing but log or message text are left out of the score and counted.
A survivor is *explained* when quality/survivors.toml gives the reason it is equivalent or harmless.
The summary goes to quality/results/ (one Markdown file per module, summary.md and summary.json).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUALITY = ROOT / "quality"
SURVIVORS = QUALITY / "survivors.toml"


@dataclass(frozen=True)
class Target:
    path: str
    tests: tuple[str, ...]  # in-process tests; mutmut picks, per function, those that call it
    daemon_tests: tuple[str, ...] = ()  # subprocess-based tests, run against what pass 1 left alive
    # Functions whose only output is text for people: a changed string, number or operator in them is
    # message text (a call given something else is not: it can raise).
    message_functions: frozenset[str] = frozenset()


# Tests left out of pass 1: cross-checks against a real Prometheus or promtool that take seconds
# per run and judge the shipped PromQL more than the module (each survivor would pay for them).
# Chromium drawing the report's charts takes seconds and judges the rendering, not the figures.
DESELECT = (
    "tests/test_gpm_rules.py::test_daemon_and_prometheus_agree_on_the_activity_rules",
    "tests/test_report_html.py::test_chromium_draws_the_charts",
    "tests/test_report_html.py::test_the_page_reads_whole_at_1000_and_1400_px",
)


# Adding a module is one entry here (and its tests).
TARGETS: dict[str, Target] = {
    "rules": Target(
        "gpu_exporter/alerting/rules.py",
        tests=(
            RULE_TESTS := (
                "tests/test_rules.py",
                "tests/test_rule_properties.py",
                "tests/test_gpm_rules.py",
                "tests/test_alert_payloads.py",
                # The driver's verdict (issue 36): the fabric's and the recovery action's rules, on the fake.
                "tests/test_fabric.py",
                "tests/test_recovery_action.py",
            )
        ),
        daemon_tests=("tests/test_exporter_once.py",),
        message_functions=frozenset({"_gpu", "_pct", "_minutes", "averaged"}),
    ),
    "engine": Target(
        "gpu_exporter/alerting/engine.py",
        tests=(
            *RULE_TESTS,
            "tests/test_alert_delivery.py",
            "tests/test_webhook_routing.py",
            "tests/test_clock_steps.py",
            "tests/test_holders_everywhere.py",
            "tests/test_reload_parts.py",
        ),
        daemon_tests=(
            "tests/test_exporter_once.py",
            "tests/test_alert_delivery.py::test_webhook_gets_alertmanager_payload_v4",
            "tests/test_alert_delivery.py::test_alertmanager_delivers_alert_and_resolution",
        ),
    ),
    "window": Target("gpu_exporter/alerting/window.py", tests=RULE_TESTS),
    "exposition": Target(
        "gpu_exporter/serving/exposition.py",
        tests=(
            "tests/test_exposition.py",
            "tests/test_exporter_metrics.py",
            "tests/test_exporter_promtool.py",
            "tests/test_hostile_names.py",
        ),
        daemon_tests=("tests/test_exporter_daemon.py::test_http_endpoints",),
    ),
    "delivery": Target(
        "gpu_exporter/alerting/delivery.py",
        tests=(
            DELIVERY_TESTS := (
                "tests/test_alert_delivery.py",
                "tests/test_webhook_delivery.py",
                "tests/test_webhook_routing.py",
                "tests/test_alert_payloads.py",
                "tests/test_delivery_hostile.py",
                "tests/test_clock_steps.py",
                "tests/test_secrets.py",
                "tests/test_reload_parts.py",
            )
        ),
        daemon_tests=(
            "tests/test_delivery_hostile.py",  # its exit test runs a receiver in a subprocess
            "tests/test_alert_delivery.py::test_alertmanager_outage_loses_nothing",
            "tests/test_alert_delivery.py::test_webhook_gets_alertmanager_payload_v4",
            "tests/test_alert_delivery.py::test_receivers_from_flags",
        ),
        message_functions=frozenset({"_reply_excerpt"}),
    ),
    "routing": Target(
        "gpu_exporter/alerting/routing.py",
        tests=DELIVERY_TESTS,
        daemon_tests=(
            "tests/test_alert_chain.py::test_the_direct_webhook_notifies_as_alertmanager_does",
            "tests/test_alert_chain.py::test_the_direct_webhook_repeats_as_alertmanager_does",
        ),
    ),
    "gpm": Target(
        "gpu_exporter/sources/gpm.py",
        tests=("tests/test_gpm_pairs.py", "tests/test_gpm.py"),
        daemon_tests=("tests/test_gpm.py", "tests/test_exporter_mig.py"),
    ),
    # What every consumer reads of a reading: memory held, the activity signal, PCIe link speed.
    "snapshot": Target(
        "gpu_exporter/snapshot.py",
        tests=(
            *RULE_TESTS,
            "tests/test_snapshot_values.py",
            "tests/test_accounting.py",
            "tests/test_attribution.py",
            "tests/test_gpm_pairs.py",
            "tests/test_holders_everywhere.py",
            "tests/test_holder_attribution.py",
        ),
        daemon_tests=("tests/test_exporter_once.py", "tests/test_cost_once.py"),
    ),
    # The books (issue 14): a GPU's state, the hours and money in each, memory peaks, prices.
    "states": Target(
        "gpu_exporter/accounting/states.py",
        tests=(
            ACCOUNTING_TESTS := (
                "tests/test_accounting.py",
                "tests/test_accounting_edges.py",
                "tests/test_accounting_daemon.py",
                "tests/test_holders_everywhere.py",
            )
        ),
        daemon_tests=("tests/test_cost_once.py",),
    ),
    "ledger": Target(
        "gpu_exporter/accounting/ledger.py",
        tests=(
            *ACCOUNTING_TESTS,
            "tests/test_exporter_metrics.py",
            "tests/test_clock_steps.py",
            "tests/test_reload_parts.py",
            "tests/test_ledger_squatters.py",  # places by booked time, not arrival (issue 38)
        ),
        daemon_tests=("tests/test_cost_once.py",),
    ),
    "peaks": Target("gpu_exporter/accounting/peaks.py", tests=ACCOUNTING_TESTS),
    # Who holds a GPU outside Kubernetes (issue 30): a wrong job, container or none, on every series
    # and in the books; a mapping file misread while it is rewritten; an engine that holds the poller.
    "holders_cgroups": Target(
        "gpu_exporter/holders/cgroups.py",
        # ...and the paths a tenant forges in a cgroup it may create (issue 38).
        tests=("tests/test_holder_cgroups.py", "tests/test_holder_attribution.py", "tests/test_forged_holders.py"),
    ),
    "holders_slurm": Target(
        "gpu_exporter/holders/slurm.py",
        tests=("tests/test_slurm_mapping.py", "tests/test_slurm_scripts.py", "tests/test_holder_attribution.py"),
    ),
    "holders_engines": Target(
        "gpu_exporter/holders/engines.py",
        # ...the worker off the poll path, and the engine's word on a claim (issue 38).
        tests=("tests/test_engine_names.py", "tests/test_slow_engine.py", "tests/test_forged_holders.py"),
        # Real containers in real cgroups, the engine's init read through the real /proc.
        daemon_tests=("tests/test_podman_holders.py",),
    ),
    "holders_attribution": Target(
        "gpu_exporter/holders/attribution.py",
        tests=(
            "tests/test_holder_attribution.py",
            "tests/test_holders_everywhere.py",
            "tests/test_forged_holders.py",
            "tests/test_slow_engine.py",
        ),
        daemon_tests=("tests/test_podman_holders.py",),
    ),
    "pricing": Target(
        "gpu_exporter/accounting/pricing.py",
        tests=(*ACCOUNTING_TESTS, "tests/test_exporter_metrics.py"),
        daemon_tests=("tests/test_cost_once.py",),
    ),
    # `gpu-exporter report` (issue 14): the queries it sends, the figures it adds up, its advice.  The
    # report on a backfilled week in a real Prometheus (test_report_history) runs as a subprocess and
    # takes about 40 s to set up: it is the daemon pass, on what the in-process tests leave alive.
    "model": Target(
        "gpu_exporter/report/model.py",
        tests=(
            REPORT_TESTS := (
                "tests/test_report_html.py",
                "tests/test_rightsizing.py",
                "tests/test_rightsizing_pipes.py",  # each pipe, bandwidth, NVLink, bursts (issue 37)
                "tests/test_rightsizing_jobs.py",  # a job advised as one; assumptions said (issue 37)
                "tests/test_report_recorded_rules.py",  # the recorded path's rules and choice (issue 37)
                "tests/test_report_mutants.py",
                "tests/test_report_model.py",
                "tests/test_report_queries.py",
                "tests/test_report_config.py",
                "tests/test_report_holder_kinds.py",
                "tests/test_report_dedupe.py",
                "tests/test_report_price_changes.py",  # the prices where they change plan as every step's
                "tests/test_report_paths.py",  # a range read in parts: which series, and its money
                "tests/test_report_csv.py",  # the charges FinOps tools read (issue 37)
                "tests/test_report_charges.py",
                "tests/test_report_focus.py",
            )
        ),
        daemon_tests=(REPORT_DAEMON_TESTS := ("tests/test_report_history.py",)),
    ),
    "queries": Target("gpu_exporter/report/queries.py", tests=REPORT_TESTS, daemon_tests=REPORT_DAEMON_TESTS),
    "rightsizing": Target(
        "gpu_exporter/report/rightsizing.py",
        tests=REPORT_TESTS,
        daemon_tests=REPORT_DAEMON_TESTS,
        message_functions=frozenset({"hours_text", "article", "_pct"}),  # the words of an advice
    ),
    # The cards advice may name (issue 37): a card's rates, memory or NVLink misread, a name that takes
    # another card's figures (a GH200 read as an H200), a MIG slice's share of its card.
    # Its own tests load a catalogue file in the test: the suite's module-level catalogues are loaded at
    # import, before a mutant is switched on, so they cannot tell load_catalogue's mutants apart.
    "catalogue": Target(
        "gpu_exporter/report/catalogue.py",
        tests=("tests/test_catalogue_offers.py", *REPORT_TESTS),
        # The file read as UTF-8 whatever the locale: a subprocess under LC_ALL=C, which pass 1 cannot see.
        daemon_tests=(
            "tests/test_catalogue_offers.py::test_a_catalogue_is_read_as_utf8_whatever_the_locale",
            *REPORT_DAEMON_TESTS,
        ),
    ),
    # Issue 25: which price each GPU's hours are multiplied by, and what a suggested card costs.
    "cost": Target("gpu_exporter/report/cost.py", tests=REPORT_TESTS, daemon_tests=REPORT_DAEMON_TESTS),
    "prices": Target("gpu_exporter/report/prices.py", tests=REPORT_TESTS, daemon_tests=REPORT_DAEMON_TESTS),
    # Which series each part of a range is read from, and the parts' answers put together: a part read
    # twice or not at all, a price now from the wrong part, a timeline hour lost.  The daemon pass is
    # the real Prometheus and VictoriaMetrics with recorded series (test_report_recorded).
    "paths": Target(
        "gpu_exporter/report/paths.py", tests=REPORT_TESTS, daemon_tests=("tests/test_report_recorded.py",)
    ),
    # A large fleet asked in shards of GPUs (issue 53): a GPU in two shards is billed twice, in none not
    # at all; a timeline not added up shows one shard's hours.
    "shards": Target(
        "gpu_exporter/report/shards.py",
        tests=("tests/test_report_shards.py",),
        daemon_tests=("tests/test_report_recorded.py",),
    ),
    # The charges of --format csv and focus: a period cut or joined wrongly, cents that do not add up.
    "charges": Target("gpu_exporter/report/charges.py", tests=REPORT_TESTS, daemon_tests=REPORT_DAEMON_TESTS),
    # Who holds a GPU, read back from a series' labels: a holder lost or merged loses its cost and the
    # one to reclaim an idle GPU from.
    "report_holders": Target("gpu_exporter/report/holders.py", tests=REPORT_TESTS, daemon_tests=REPORT_DAEMON_TESTS),
    # Pod attribution's kubelet client: a wrong decode or a call that never ends puts the wrong pod,
    # or none, on every series of a node.
    "podresources": Target(
        "gpu_exporter/kubernetes/podresources.py",
        tests=(
            "tests/test_podresources_wire.py",
            "tests/test_kubelet.py",
            "tests/test_grpc_unix.py",
            "tests/test_kubelet_budget.py",
        ),
    ),
    # What each device the kubelet lists names (issue 35): DRA, GKE, HAMi and NVIDIA's device plugin;
    # a wrong key gives a GPU to nobody (then "release" in the report) or to the wrong pod.
    "kubelet_devices": Target(
        "gpu_exporter/kubernetes/devices.py",
        tests=("tests/test_kubelet_devices.py", "tests/test_kubelet.py", "tests/test_podresources_wire.py"),
    ),
    # ...and the join into the snapshot: which GPU, MIG device and process each key gives to whom,
    # the pod UID only where the pod's own processes vouch for it.
    "pod_attribution": Target(
        "gpu_exporter/kubernetes/attribution.py",
        tests=("tests/test_attribution.py", "tests/test_kubelet_devices.py"),
    ),
    # ...and its one gRPC call: a misread status or answer, a call that outlives its deadline or a
    # socket left open per refresh.
    "grpc_unix": Target(
        "gpu_exporter/kubernetes/grpc_unix.py",
        tests=("tests/test_grpc_unix.py", "tests/test_kubelet.py"),
        message_functions=frozenset({"_describe"}),  # shortens an h2 error for a sentence
    ),
    # The web server (issue 27): what a request may look like, who is closed to make room, a password
    # check, the web config key by key.  Each target's own tests are fast and run per mutant; the
    # server tests over real sockets (a minute and a half) run against what they leave alive.
    "web_http": Target(
        "gpu_exporter/web/http.py",
        tests=("tests/test_web_http.py",),
        daemon_tests=(WEB_SOCKET_TESTS := ("tests/test_web_security.py", "tests/test_web_hostile.py")),
    ),
    "web_table": Target(
        "gpu_exporter/web/table.py",
        tests=(
            WEB_CONNECTION_TESTS := (
                "tests/test_web_connections.py",
                "tests/test_web_tls.py",
                "tests/test_web_floods.py",
                "tests/test_web_tls_fallback.py",  # the public TLS path: what the table and a connection do for it
            )
        ),
        daemon_tests=(*WEB_SOCKET_TESTS, "tests/test_web_tls.py"),
    ),
    "web_connection": Target(
        "gpu_exporter/web/connection.py",
        tests=WEB_CONNECTION_TESTS,
        daemon_tests=(*WEB_SOCKET_TESTS, "tests/test_web_tls.py"),
    ),
    "web_auth": Target(
        "gpu_exporter/web/auth.py",
        tests=("tests/test_web_auth.py", "tests/test_web_floods.py"),
        daemon_tests=WEB_SOCKET_TESTS,
    ),
    "web_rate_limit": Target("gpu_exporter/web/rate_limit.py", tests=("tests/test_web_rate_limit.py",)),
    "web_config": Target(
        "gpu_exporter/web/config.py",
        tests=(WEB_CONFIG_TESTS := ("tests/test_web_config.py", "tests/test_web_tls.py")),
        daemon_tests=("tests/test_bad_input.py", "tests/test_web_security.py"),
    ),
    "web_tls_context": Target(
        "gpu_exporter/web/tls_context.py",
        tests=WEB_CONFIG_TESTS,
        daemon_tests=("tests/test_bad_input.py", "tests/test_web_security.py"),
    ),
    # The one place that knows asyncio's private TLS protocol: a handshake that hangs, a client's
    # first bytes lost, a stalled handshake not told apart, a Python it was never checked on.
    "web_tls": Target(
        "gpu_exporter/web/tls.py",
        # ...and the public path it falls back to where that protocol changed (issue 34, item 9).
        tests=("tests/test_web_tls_adapter.py", "tests/test_web_tls.py", "tests/test_web_tls_fallback.py"),
        daemon_tests=WEB_SOCKET_TESTS,
    ),
    # The server itself: which answer a request gets (405, 503, 429, 401, 404, a page), whether the
    # connection stays, what a slow or silent client is given, the web config's headers on each answer.
    "web_server": Target(
        "gpu_exporter/web/server.py",
        tests=(
            "tests/test_web_server.py",
            "tests/test_web_floods.py",
            "tests/test_web_rate_limit.py",
            "tests/test_web_tls.py",
            "tests/test_web_tls_adapter.py",
            "tests/test_web_tls_fallback.py",
        ),
        # The server in a process of its own first: whether it holds the process at its end.
        daemon_tests=(
            "tests/test_web_server.py::test_a_process_that_ends_without_stop_is_not_held_by_the_server",
            *WEB_SOCKET_TESTS,
        ),
    ),
    # The web config in force: a changed file or certificate not read again, a broken edit taken, a
    # write that lands during a reload lost.
    "web_watcher": Target(
        "gpu_exporter/web/watcher.py",
        tests=("tests/test_web_watcher.py",),
        daemon_tests=("tests/test_web_security.py",),
    ),
    # What a client can make the server log, once an interval with a count; the listen address.
    "web_pacing": Target("gpu_exporter/web/pacing.py", tests=("tests/test_web_floods.py", "tests/test_web_auth.py")),
    "web_address": Target("gpu_exporter/web/address.py", tests=("tests/test_web_address.py",)),
    # (the web server's targets end here)
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), read from its .meta files.
KILLED, SURVIVED, NO_TESTS = {1, 3}, {0}, {33, 5}
TIMEOUT = {36, -24, 24, 152, 255}

# Calls whose arguments are log output only: structlog's bound logger.
LOG_OBJECTS = {"log"}
# Keyword arguments and positions that hold text for people: an alert's summary and description
# (``Check``), what the report's progress lines call a query (``Query``'s ``what``), the sentence
# of a failed kubelet call (``RpcError``'s ``details``; the code beside it is read, so it counts)
# and what the call was doing when it failed (the methods that build those sentences).  Functions
# and methods alike, by the name called.
MESSAGE_KEYWORDS = {"summary", "description"}
MESSAGE_POSITIONS = {
    "Check": {4, 5},
    "Query": {1},
    "RpcError": {1},
    "_timed_out": {0},
    "_unavailable": {0},
    "_remaining": {1},
}


# -- the scratch copy ---------------------------------------------------------------------------------
def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout.decode()  # fmt: skip
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def refresh_tests(work: Path, target: Target) -> None:
    """Bring the work tree's tests up to date (for --reuse: the mutants stay, the tests change)."""
    shutil.rmtree(work / "tests")
    # mutmut records which tests call each function once, and on a later run adds only new tests: a
    # test that now calls a function it did not would never be run against that function's mutants.
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    for rel in tracked_files():
        if rel.startswith("tests/"):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, work / rel)
    # A test file added to the target since its last run is in the selection, as a fresh run would have it.
    config = work / "pyproject.toml"
    line = f"pytest_add_cli_args_test_selection = {json.dumps(selected_tests(work, [target]))}"
    config.write_text(re.sub(r"^pytest_add_cli_args_test_selection = .*$", lambda _: line, config.read_text(),
                             count=1, flags=re.MULTILINE))  # fmt: skip


def selected_tests(work: Path, targets: list[Target]) -> list[str]:
    return sorted({t for tg in targets for t in tg.tests if (work / t.partition("::")[0]).exists()})


def prepare(work: Path, names: list[str], tests_from: str | None = None) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for rel in tracked_files():
        if rel.startswith("quality/results/"):
            continue
        dest = work / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    if tests_from:  # the tests as they were at another commit (to measure a score before a change)
        shutil.rmtree(work / "tests")
        listing = subprocess.run(["git", "ls-tree", "-r", "-z", "--name-only", tests_from, "tests/"], cwd=ROOT,
                                 check=True, capture_output=True).stdout.decode()  # fmt: skip
        for rel in filter(None, listing.split("\0")):
            blob = subprocess.run(["git", "show", f"{tests_from}:{rel}"], cwd=ROOT, check=True, capture_output=True)
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(blob.stdout)
    targets = [TARGETS[n] for n in names]
    tests = selected_tests(work, targets)
    config = {
        "source_paths": ["gpu_exporter"],
        "only_mutate": [tg.path for tg in targets],
        "also_copy": ["alerts", "deploy", "benchmarks", "docs", "README.md"],
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", *(f"--deselect={t}" for t in DESELECT)],
        "use_git_change_detection": False,
        # A mutant that hangs a test is stopped after 6x the tests' usual time plus 6 s (mutmut's
        # default, 15x + 15 s, spends most of a run waiting on delivery threads that never wake).
        "timeout_multiplier": 6.0,
    }
    # On PYTHONPATH from the start (run_env): it must exist then, or Python caches it as a dead end.
    (work / "mutants").mkdir()
    # Tests that look for the venv next to the code (the oldest nvidia-ml-py kept there) find it.
    (work / "mutants" / ".venv").symlink_to(ROOT / ".venv")
    with (work / "pyproject.toml").open("a") as f:
        f.write("\n[tool.mutmut]\n")
        for key, value in config.items():
            f.write(f"{key} = {json.dumps(value)}\n")


def run_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    # A daemon the tests start as a subprocess imports the mutated package, whatever its cwd.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / "mutants"), env.get("PYTHONPATH", "")) if p)
    env.pop("MUTANT_UNDER_TEST", None)
    return env


def stray_processes(work: Path) -> Iterator[int]:
    """Processes a killed mutant left behind (a daemon whose test was stopped): their cwd is in ``work``."""
    me = os.getpid()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            cwd = os.readlink(p / "cwd")
        except OSError:
            continue
        if cwd == str(work) or cwd.startswith(str(work) + os.sep):
            yield int(p.name)


def end_strays(work: Path) -> int:
    n = 0
    for pid in stray_processes(work):
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


# -- pass 1 and 2 -----------------------------------------------------------------------------------
def mutmut_pass(work: Path, jobs: int, log: Path, only: list[str] | None = None) -> float:
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.monotonic()
    with log.open("w") as out:
        cmd = [str(mutmut), "run", "--max-children", str(jobs), *(only or [])]
        rc = subprocess.run(cmd, cwd=work, env=run_env(work),
                            stdout=out, stderr=subprocess.STDOUT).returncode  # fmt: skip
    if rc != 0:
        sys.exit(f"mutation: mutmut run failed ({rc}); see {log}")
    return time.monotonic() - start


def load_results(work: Path, target: Target) -> dict[str, int | None]:
    meta = json.loads((work / "mutants" / (target.path + ".meta")).read_text())
    codes: dict[str, int | None] = meta["exit_code_by_key"]
    return codes


def daemon_pass(work: Path, target: Target, mutant: str, timeout: float) -> str:
    """Run the target's subprocess-based tests with ``mutant`` active: killed, survived or timeout."""
    env = run_env(work)
    env["MUTANT_UNDER_TEST"] = mutant
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--rootdir=.",
           *target.daemon_tests]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=work / "mutants", env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = None
    with contextlib.suppress(OSError):  # whatever the tests left running (a daemon whose test was cut short)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if rc is None:
        return "timeout"
    return "survived" if rc == 0 else "killed"


# -- what a mutant changed ----------------------------------------------------------------------------
def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[item.name] = item
    return found


Step = tuple[Any, str, int | None]  # (node, field, index in a list field)


def _differences(a: Any, b: Any, trail: list[Step]) -> Iterator[tuple[list[Step], Any, Any]]:
    if type(a) is not type(b):
        yield trail, a, b
    elif isinstance(a, ast.AST):
        for name in a._fields:
            yield from _differences(getattr(a, name), getattr(b, name), [*trail, (a, name, None)])
    elif isinstance(a, list):
        if len(a) != len(b):
            yield trail, a, b
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if trail:
                node, name, _ = trail[-1]
                yield from _differences(x, y, [*trail[:-1], (node, name, i), (x, "", None)])
            else:
                yield from _differences(x, y, trail)
    elif a != b:
        yield trail, a, b


def _is_log_call(node: Any) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in LOG_OBJECTS)  # fmt: skip


def _called(call: ast.Call) -> str:
    """The name a call is made by: ``f`` for ``f(...)``, ``m`` for ``self.m(...)``."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _plain_text_change(nodes: list[Any], a: Any, b: Any) -> bool:
    """A changed string, number, arithmetic or and/or, with no call getting something else on the way."""
    if any(isinstance(n, ast.Call) for n in nodes) and not (isinstance(a, str) and isinstance(b, str)):
        return False
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return (isinstance(a, str) and isinstance(b, str)) or numbers or isinstance(nodes[-1], ast.BinOp | ast.BoolOp)


def _text_only(trail: list[Step], a: Any, b: Any, message_function: bool = False) -> bool:
    """Whether this one difference changes only text for people (and cannot raise)."""
    nodes = [node for node, _, _ in trail]
    if message_function:
        return _plain_text_change(nodes[1:], a, b)
    for i, (node, name, index) in enumerate(trail):
        inner = nodes[i + 1 :]
        if _is_log_call(node):
            # Log output, unless a call inside the arguments now gets something else (``dict(None)``
            # raises before anything is logged).
            return not any(isinstance(n, ast.Call) for n in inner)
        in_message = (isinstance(node, ast.keyword) and node.arg in MESSAGE_KEYWORDS) or (
            isinstance(node, ast.Call) and name == "args" and index in MESSAGE_POSITIONS.get(_called(node), set())
        )
        if in_message:
            if isinstance(a, str) and isinstance(b, str):
                return True  # a changed string literal
            # Inside an f-string: arithmetic or and/or on what it shows, and no call getting
            # something else (``_pct(None)`` raises); a changed condition of an ``if`` can raise too.
            strings = [j for j, n in enumerate(inner) if isinstance(n, ast.JoinedStr)]
            return bool(strings) and _plain_text_change(inner[strings[0] :], a, b)
    return False


@dataclass
class Mutant:
    name: str
    function: str
    status: str  # killed, killed-daemon, timeout, survived, no-tests, text
    diff: str = ""
    reason: str = ""

    @property
    def change(self) -> str:
        """The mutated lines, as the key that quality/survivors.toml explains."""
        return " / ".join(line[1:].strip() for line in self.diff.splitlines()
                          if line.startswith("+") and not line.startswith("+++"))  # fmt: skip


def function_of(key: str) -> str:
    mangled = key.rpartition(".")[2].partition("__mutmut_")[0]
    if "ǁ" in mangled:
        _, cls, fn = mangled.split("ǁ")
        return f"{cls}.{fn}"
    return mangled.removeprefix("x_")


def classify_text(work: Path, target: Target, keys: list[str]) -> set[str]:
    """The mutants that change only log or message text."""
    tree = ast.parse((work / "mutants" / target.path).read_text())
    functions = _functions(tree)
    text = set()
    for key in keys:
        mangled_mutant = key.rpartition(".")[2]
        mangled = mangled_mutant.partition("__mutmut_")[0]
        in_message_function = function_of(key).rpartition(".")[2] in target.message_functions
        orig, mutant = functions.get(mangled + "__mutmut_orig"), functions.get(mangled_mutant)
        if orig is None or mutant is None:
            continue
        if only_text(orig, mutant, in_message_function):
            text.add(key)
    return text


def only_text(orig: ast.AST, mutant: ast.AST, message_function: bool = False) -> bool:
    """Whether ``mutant`` (a function) differs from ``orig`` only in text for people, in ways that cannot raise."""
    found = [(t, a, b) for t, a, b in _differences(orig, mutant, []) if not (len(t) == 1 and t[0][1] == "name")]
    return bool(found) and all(_text_only(t, a, b, message_function) for t, a, b in found)


def diffs(work: Path, target: Target, keys: list[str]) -> dict[str, str]:
    """mutmut's own diff of each mutant (imported here: mutmut reads its config from the cwd)."""
    cwd = os.getcwd()
    os.chdir(work)
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        return {k: get_diff_for_mutant(k, path=target.path) for k in keys}
    finally:
        os.chdir(cwd)


# -- explanations and reports ---------------------------------------------------------------------------
def explanations() -> dict[str, list[dict[str, str]]]:
    if not SURVIVORS.exists():
        return {}
    data = tomllib.loads(SURVIVORS.read_text())
    return {module: list(entries) for module, entries in data.items()}


def explain(module: str, m: Mutant, known: dict[str, list[dict[str, str]]]) -> str:
    """The reason survivors.toml gives for ``m``: an entry whose ``function`` (a glob) matches and whose
    ``change`` is the mutated line(s), or whose ``pattern`` (a regular expression) matches them whole."""
    return explain_change(module, m.function, m.change, known)


def explain_change(module: str, function: str, change: str, known: dict[str, list[dict[str, str]]]) -> str:
    for entry in known.get(module, []):
        if not fnmatch.fnmatchcase(function, entry["function"]):
            continue
        if entry.get("change") == change or ("pattern" in entry and re.fullmatch(entry["pattern"], change)):
            return entry["reason"]
    return ""


@dataclass
class Summary:
    module: str
    path: str
    mutants: list[Mutant] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    source_sha256: str = ""

    def count(self, *statuses: str) -> int:
        return sum(1 for m in self.mutants if m.status in statuses)

    @property
    def scored(self) -> int:
        return len(self.mutants) - self.count("text")

    @property
    def detected(self) -> int:
        return self.count("killed", "killed-daemon", "timeout")

    @property
    def score(self) -> float:
        return self.detected / self.scored if self.scored else 1.0

    @property
    def score_explained_aside(self) -> float:
        """The score with the survivors survivors.toml explains (equivalent or harmless) left out."""
        counted = self.scored - (len(self.alive) - len(self.unexplained))
        return self.detected / counted if counted else 1.0

    @property
    def alive(self) -> list[Mutant]:
        return [m for m in self.mutants if m.status in ("survived", "no-tests")]

    @property
    def unexplained(self) -> list[Mutant]:
        return [m for m in self.alive if not m.reason]

    def as_json(self) -> dict[str, Any]:
        return {"module": self.module, "path": self.path, "mutants": len(self.mutants),
                "text_only_excluded": self.count("text"), "scored": self.scored,
                "killed_in_process": self.count("killed"), "killed_by_daemon_tests": self.count("killed-daemon"),
                "timeout": self.count("timeout"), "survived": self.count("survived"),
                "no_tests": self.count("no-tests"), "explained": len(self.alive) - len(self.unexplained),
                "unexplained": len(self.unexplained), "score": round(self.score, 4),
                "score_explained_aside": round(self.score_explained_aside, 4),
                "seconds": {k: round(v) for k, v in sorted(self.seconds.items())},
                "source_sha256": self.source_sha256,
                "survivors": [{"function": m.function, "change": m.change, "status": m.status}
                              for m in sorted(self.alive, key=lambda m: (m.function, m.name))]}  # fmt: skip


def write_module_report(s: Summary, out: Path) -> None:
    j = s.as_json()
    lines = [
        f"# Mutation testing: `{s.path}`",
        "",
        f"Score **{s.score:.1%}** ({s.score_explained_aside:.1%} with the explained survivors left out): "
        f"{s.detected} of {s.scored} mutants detected "
        f"({j['killed_in_process']} by in-process tests, {j['killed_by_daemon_tests']} only by daemon tests, "
        f"{j['timeout']} by timeout); {j['text_only_excluded']} mutants that change only log or message text "
        f"left out of {len(s.mutants)}.",
        "",
    ]
    if s.alive:
        lines += [f"## Survivors ({len(s.alive)}; {len(s.unexplained)} without a reason)", ""]
        for m in sorted(s.alive, key=lambda m: (m.function, m.name)):
            lines += [f"### `{m.function}`: {m.name.rpartition('.')[2]} ({m.status})", "",
                      f"Why it is equivalent or harmless: {m.reason or '**not explained yet**'}", "",
                      "```diff", m.diff, "```", ""]  # fmt: skip
    else:
        lines += ["No survivors.", ""]
    out.write_text("\n".join(lines))


def write_summary(results: Path, fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write summary.md and summary.json: the modules just run replace their rows, the others keep theirs."""
    path = results / "summary.json"
    kept = {m["module"]: m for m in json.loads(path.read_text())["modules"]} if path.exists() else {}
    kept.update({m["module"]: m for m in fresh})
    modules = [kept[n] for n in TARGETS if n in kept]
    rows = [
        "| module | mutants | text only (excluded) | detected | by daemon tests | survived (explained) | score "
        "| score, explained survivors aside | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for j in modules:
        detected = j["killed_in_process"] + j["killed_by_daemon_tests"] + j["timeout"]
        alive = j["survived"] + j["no_tests"]
        minutes = sum(j.get("seconds", {}).values()) / 60
        score = detected / j["scored"] if j["scored"] else 1.0  # the counts, not the rounded JSON figure
        counted = j["scored"] - j["explained"]
        aside = detected / counted if counted else 1.0
        rows.append(f"| [{j['module']}]({j['module']}.md) `{j['path']}` | {j['mutants']} | {j['text_only_excluded']} | "
                    f"{detected} | {j['killed_by_daemon_tests']} | {alive} ({j['explained']}) | {score:.1%} | "
                    f"{aside:.1%} | {minutes:.0f} |")  # fmt: skip
    text = "\n".join(["# Mutation score per module", "",
                      "Written by `quality/mutation.py` (mutmut 3.8.1); see quality/README.md for what the columns "
                      "count.  *minutes*: what mutmut's pass and the daemon pass took on the 2-core machine, added "
                      "up over the `--reuse` runs that measured the module.", "", *rows, ""])  # fmt: skip
    (results / "summary.md").write_text(text)
    path.write_text(json.dumps({"modules": modules}, indent=2, ensure_ascii=False) + "\n")
    return modules


def source_digest(target: Target) -> str:
    return hashlib.sha256((ROOT / target.path).read_bytes()).hexdigest()[:16]


def check(results: Path, names: list[str], fail_under: float) -> bool:
    """Whether the committed results hold every module, each survivor with a reason in survivors.toml
    and each score at least ``fail_under``.  Reads results/summary.json only: no mutant is run."""
    path = results / "summary.json"
    measured = {m["module"]: m for m in json.loads(path.read_text())["modules"]} if path.exists() else {}
    known = explanations()
    ok = True
    for name in names:
        j = measured.get(name)
        if j is None:
            print(f"mutation: {name}: no results in {path}; run quality/mutation.py {name}")
            ok = False
            continue
        for sv in j["survivors"]:
            if not explain_change(name, sv["function"], sv["change"], known):
                print(f"mutation: {name}: survivor without a reason in {sv['function']}: {sv['change']}")
                ok = False
        if j["score"] < fail_under:
            print(f"mutation: {name} scores {j['score']:.1%}, below {fail_under:.0%}")
            ok = False
        if j.get("source_sha256") != source_digest(TARGETS[name]):
            # A note, not a failure: a change to a module does not have to wait for an hour's run.
            print(f"mutation: {name}: {TARGETS[name].path} changed since it was measured; "
                  f"run quality/mutation.py {name} to measure it again")  # fmt: skip
        print(f"mutation: {name}: {j['score']:.1%} ({len(j['survivors'])} survivors)")
    return ok


# -- main ---------------------------------------------------------------------------------------------
def run_module(name: str, args: argparse.Namespace, known: dict[str, list[dict[str, str]]]) -> Summary:
    """mutmut's pass and the daemon pass on one module, in its own scratch copy ``--work/<name>``."""
    target = TARGETS[name]
    work: Path = (args.work / name).resolve()
    work.mkdir(parents=True, exist_ok=True)
    lock = work.with_name(name + ".lock").open("w")
    try:  # one run per work tree: a second would take the first one's processes for strays
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"mutation: another run is using {work}")
    again: list[str] = []
    if args.report_only or args.daemon_only:
        pass
    elif args.reuse and (work / "mutants").is_dir():
        refresh_tests(work, target)
        codes = load_results(work, target)
        again = [k for k, code in codes.items()
                 if code is None or (not args.untested and code in SURVIVED | NO_TESTS)]  # fmt: skip
        if args.mutants:
            again = [k for k in again if any(fnmatch.fnmatchcase(k, g) for g in args.mutants)]
        print(f"mutation: {name}: re-testing {len(again)} mutants left alive in {work}", flush=True)
    else:
        prepare(work, [name], args.tests_from)
    seconds: dict[str, float] = {}
    print(f"mutation: mutmut on {name} in {work}", flush=True)
    if not (args.report_only or args.daemon_only) and (again or not args.reuse):
        seconds["mutmut"] = mutmut_pass(work, args.jobs, work / "mutmut.log", again)
        end_strays(work)  # mutmut has exited: what is left in the work tree was left by a killed mutant

    # Verdicts of the daemon pass, kept so that --reuse and --report-only do not run it again.
    cache = work / "daemon-verdicts.json"
    verdicts: dict[str, str] = json.loads(cache.read_text()) if cache.exists() else {}
    daemon_start = time.monotonic()
    codes = load_results(work, target)
    keys = sorted(codes)
    text = classify_text(work, target, keys)
    mutants = []
    for key in keys:
        code = codes[key]
        if key in text:
            status = "text"
        elif code in KILLED:
            status = "killed"
        elif code in TIMEOUT:
            status = "timeout"
        elif code in NO_TESTS:
            status = "no-tests"
        elif code in SURVIVED:
            status = "survived"
        else:
            status = f"other ({code})"
        mutants.append(Mutant(key, function_of(key), status))
    alive = [m for m in mutants if m.status in ("survived", "no-tests")]
    for m, d in zip(alive, diffs(work, target, [m.name for m in alive]).values(), strict=True):
        m.diff = d
        m.reason = explain(name, m, known)
    if target.daemon_tests and not args.no_daemon_pass:
        # An explained survivor is equivalent or harmless: the daemon tests cannot tell it apart either.
        todo = [m for m in alive if (args.daemon_all or not m.reason) and not args.report_only
                and verdicts.get(m.name) in (None, "survived")]  # fmt: skip
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run in its own process group
            runs = {m.name: pool.submit(daemon_pass, work, target, m.name, args.daemon_timeout) for m in todo}
            for key, run in runs.items():
                verdicts[key] = run.result()
                cache.write_text(json.dumps(verdicts, indent=1, sort_keys=True))
                print(f"mutation: {name} {key.rpartition('.')[2]}: daemon tests: {verdicts[key]}", flush=True)
        for m in alive:
            if verdicts.get(m.name) in ("killed", "timeout"):
                m.status = "killed-daemon" if verdicts[m.name] == "killed" else "timeout"
    if not args.report_only:
        seconds["daemon tests"] = time.monotonic() - daemon_start
    timing = work / "seconds.json"  # what each pass took, added up over --reuse runs
    before: dict[str, float] = json.loads(timing.read_text()) if timing.exists() else {}
    if args.reuse or args.daemon_only or args.report_only:
        seconds = {k: before.get(k, 0.0) + seconds.get(k, 0.0) for k in {*before, *seconds}}
    timing.write_text(json.dumps(seconds))
    summary = Summary(name, target.path, mutants)
    summary.seconds = seconds
    # The source as it was measured (the scratch copy's): --check notes when the module has changed since.
    summary.source_sha256 = hashlib.sha256((work / target.path).read_bytes()).hexdigest()[:16]
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", help=f"any of: {', '.join(TARGETS)} (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    p.add_argument("--work", type=Path, default=QUALITY / ".work",
                   help="scratch copies, one folder per module (default quality/.work)")  # fmt: skip
    p.add_argument("--results", type=Path, default=QUALITY / "results", help="where the summary goes")
    p.add_argument("--daemon-timeout", type=float, default=300, help="seconds for one mutant's daemon tests")
    p.add_argument("--tests-from", metavar="REV", help="use the tests/ of this git revision (a score before)")
    p.add_argument("--reuse", action="store_true",
                   help="keep the mutants and verdicts of the module's last run in --work; re-test only what was "
                        "left alive (after adding tests)")  # fmt: skip
    p.add_argument("--untested", action="store_true", help="with --reuse: re-test only mutants not tested yet")
    p.add_argument("--mutants", nargs="+", metavar="GLOB", help="with --reuse: re-test only mutants matching these")
    p.add_argument(
        "--daemon-all",
        action="store_true",
        help="run the daemon pass on explained survivors too (by default only on those without a reason)",
    )
    p.add_argument("--daemon-only", action="store_true",
                   help="skip mutmut: run the daemon pass on what the last run in --work left alive")  # fmt: skip
    p.add_argument("--report-only", action="store_true",
                   help="write the reports from the last run in --work without testing anything")  # fmt: skip
    p.add_argument("--no-daemon-pass", action="store_true", help="skip pass 2 (subprocess-based tests)")
    p.add_argument("--check", action="store_true",
                   help="run nothing: exit 1 unless the committed results hold every module named, each "
                        "survivor explained by quality/survivors.toml (and each score >= --fail-under)")  # fmt: skip
    p.add_argument("--draft", type=Path, help="write TOML stubs for unexplained survivors to this file")
    p.add_argument("--fail-under", type=float, default=0.0, help="exit 1 if a module scores below this (0-1)")
    args = p.parse_args(argv)
    names = args.modules or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        p.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    if args.check:
        return 0 if check(args.results, names, args.fail_under) else 1

    known = explanations()
    summaries = [run_module(name, args, known) for name in names]
    args.results.mkdir(parents=True, exist_ok=True)
    for s in summaries:
        write_module_report(s, args.results / f"{s.module}.md")
    write_summary(args.results, [s.as_json() for s in summaries])
    if args.draft:
        with args.draft.open("w") as f:
            for s in summaries:
                for m in s.unexplained:
                    f.write(f"[[{s.module}]]\n# {m.name.rpartition('.')[2]}\nfunction = {json.dumps(m.function)}\n"
                            f"change = {json.dumps(m.change, ensure_ascii=False)}\nreason = \"\"\n\n")  # fmt: skip
    failed = False
    for s in summaries:
        j = s.as_json()
        print(f"mutation: {s.module}: {s.score:.1%} ({s.detected}/{s.scored}; {j['text_only_excluded']} text-only "
              f"excluded; {len(s.alive)} alive, {len(s.unexplained)} unexplained; "
              f"{sum(s.seconds.values()) / 60:.0f} min)")  # fmt: skip
        for m in s.unexplained:
            print(f"mutation: {s.module}: unexplained survivor {m.name} in {m.function}:\n{m.diff}")
        if s.score < args.fail_under:
            failed = True
            print(f"mutation: {s.module} scores {s.score:.1%}, below {args.fail_under:.0%}")
    print(f"mutation: summary in {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
