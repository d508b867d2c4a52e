"""Issue 35: the report counts each GPU once, against real stores.

- Live: two ``--simulate`` daemons on loopback, node sim-a priced and node sim-b not.  One Prometheus
  scrapes sim-a from two jobs (and sim-b from one), two more (an HA pair, ``replica`` r1 and r2)
  scrape sim-a and remote-write into one VictoriaMetrics.  The report over the last minute gives each
  of sim-a's GPUs the hours and cost of a single scrape (one job's, one replica's), names the targets
  it counted once, and leaves sim-b's GPUs, whose UUIDs are their own, unpriced.
- History: two hours of hand-made samples backfilled into Prometheus and imported into
  VictoriaMetrics, for what a minute of live scrapes cannot show: replicas with gaps at different
  times, an exporter that moved to a new address in the middle of a step, two nodes reporting one
  uuid (one priced, its price changing), GPUs without a uuid on two targets.

Why "within a poll": each step's increase is the largest of the copies', each counted from the last
reading of the counter counted before the step, whichever copy read it (``queries.counted_until``).
Two scrapers of one counter read it at different moments; a step's increase differs between them only
by where their samples fall between the exporter's polls, at most a poll's time; over the range the
steps add up to the newest reading less the newest before the range, which differs from one scraper's
own by where its first and last samples fall: a poll at most at each end.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import assert_mentions
from tests.exporter_helpers import RunningDaemon, run_daemon, wait_for
from tests.prometheus_helpers import (
    Prometheus,
    VictoriaMetrics,
    prometheus,
    prometheus_with_config,
    victoria_metrics,
)

pytestmark = pytest.mark.integration

POLL_S = 1.0
PRICE = 3.0  # sim-a's H100s, per hour
MINUTE_H = 60 / 3600


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--quiet", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def as_json(url: str, *args: str) -> dict[str, Any]:
    out = report(url, "--format", "json", *args)
    assert out.returncode in (0, 4), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@contextmanager
def simulator(node: str, workdir: Path, priced: bool) -> Iterator[RunningDaemon]:
    """``gpu-exporter --simulate`` for two GPUs on node ``node`` ($NODE_NAME, as a DaemonSet sets it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"{node}.yaml"
    config.write_text(yaml.safe_dump({"pricing": {"currency": "USD", "models": {"H100": PRICE}}} if priced else {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NODE_NAME", node)
        daemon = run_daemon(Path("/nonexistent"), "--simulate", "--simulate.gpus", "2", "--config", str(config),
                            "--poll.interval", f"{POLL_S:g}s")  # fmt: skip
        running = daemon.__enter__()
    try:
        yield running
    finally:
        daemon.__exit__(None, None, None)


def scrape(job: str, *targets: str) -> dict[str, Any]:
    return {"job_name": job, "static_configs": [{"targets": list(targets)}]}


GLOBAL = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}


@dataclass
class Live:
    two_jobs: Prometheus  # sim-a by jobs gpu-a and gpu-b, sim-b by gpu-a
    pair: VictoriaMetrics  # sim-a by Prometheus replicas r1 and r2, remote-written here
    sim_a: str  # its target, host:port
    sim_b: str
    end: int  # the range is the minute before


def last_sample(query: Any) -> float:
    """The newest sample of the target that lags most: a scraper appends a target's samples in order,
    one scrape at a time, so every sample up to here is in the store, however long a scrape on a loaded
    machine takes. (The newest of all would be one target's: another's scrape begun before it, still
    in flight, would land inside the range between the report's queries.)"""
    (last,) = query("min(max by (job, instance, replica) (timestamp(gpu_state_seconds_total)))")
    return float(last["value"][1])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("dedupe")
    with ExitStack() as stack:
        a = stack.enter_context(simulator("sim-a", tmp, priced=True))
        b = stack.enter_context(simulator("sim-b", tmp, priced=False))
        sim_a, sim_b = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
        vm = stack.enter_context(victoria_metrics(tmp / "vm"))
        for replica in ("r1", "r2"):
            stack.enter_context(prometheus_with_config({
                "global": {**GLOBAL, "external_labels": {"replica": replica}},
                "scrape_configs": [scrape("gpu-exporter", sim_a)],
                "remote_write": [{"url": f"{vm.url}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}],
            }, tmp / replica))  # fmt: skip
        two_jobs = stack.enter_context(prometheus_with_config(
            {"global": GLOBAL, "scrape_configs": [scrape("gpu-a", sim_a, sim_b), scrape("gpu-b", sim_a)]},
            tmp / "two-jobs"))  # fmt: skip
        wait_for(lambda: len(two_jobs.query('gpu_state_seconds_total{state="down"}')) == 6, timeout=60,
                 what="sim-a's GPUs through two jobs, sim-b's through one")  # fmt: skip
        started = time.time()
        # A minute and a few seconds more, so that the minute reported lies wholly within the run.
        wait_for(lambda: time.time() - started >= 70, timeout=120, interval=1, what="a minute of history")
        # The minute ends before the last sample every target has in every store (remote write lags a
        # second or two).
        end = math.floor(min(last_sample(two_jobs.query), last_sample(vm.query))) - 2
        yield Live(two_jobs, vm, sim_a, sim_b, end)


def minute(live: Live) -> tuple[str, ...]:
    return ("--start", str(live.end - 60), "--end", str(live.end))


def by_uuid(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["uuid"]: g for g in doc["gpus"]}


HOURS = ("gpu_hours", "busy_hours", "allocated_idle_hours", "idle_hours", "down_hours")
ONE_POLL_H = POLL_S / 3600


def same_as_one_scrape(merged: dict[str, Any], single: dict[str, Any], steps: int) -> None:
    """Each step's increase is the largest copy's: at most a poll more than one scraper's, in a step
    where the other's samples fell on the other side of a poll; at most a poll less over the range,
    where the other copy's reading before it was newer than this one's."""
    for field in HOURS:
        assert single[field] - ONE_POLL_H <= merged[field] <= single[field] + steps * ONE_POLL_H, (
            field, merged, single)  # fmt: skip
    assert merged["gpu_hours"] <= MINUTE_H + 1e-6
    assert merged["cost"] == pytest.approx(PRICE * merged["gpu_hours"], abs=1e-4)


def test_two_jobs_scraping_one_exporter_count_its_gpus_once(live: Live) -> None:
    """sim-a's two GPUs, seen by jobs gpu-a and gpu-b: each the hours and cost of one job's scrapes, and
    the report says it counted them once; sim-b's two GPUs, from the other simulator, are GPUs of their
    own (their UUIDs differ from sim-a's), unpriced, and never charged at sim-a's price."""
    doc = as_json(live.two_jobs.url, *minute(live))
    single = by_uuid(as_json(live.two_jobs.url, *minute(live), "--selector", '{job="gpu-b"}'))
    assert len(single) == 2 and doc["totals"]["gpus"] == 4, doc["gpus"]
    steps = doc["range"]["hours"] * 3600 / doc["range"]["step_seconds"]
    gpus = by_uuid(doc)
    for uuid, one in single.items():
        g = gpus[uuid]
        same_as_one_scrape(g, one, int(steps))
        assert g["node"] == live.sim_a and g["targets"] == [{"instance": live.sim_a, "job": "gpu-a"},
                                                           {"instance": live.sim_a, "job": "gpu-b"}]  # fmt: skip
    others = [g for uuid, g in gpus.items() if uuid not in single]
    assert len(others) == 2
    for g in others:
        assert (g["node"], g["cost"], g["price_now_per_hour"]) == (live.sim_b, None, None), g
        assert g["targets"] == [{"instance": live.sim_b, "job": "gpu-a"}]
        assert MINUTE_H - 3 * ONE_POLL_H <= g["gpu_hours"] <= MINUTE_H + 1e-6
    t = doc["totals"]
    assert (t["merged_gpus"], t["unpriced_gpus"]) == (2, 2)
    assert t["cost"] == pytest.approx(sum(g["cost"] for g in gpus.values() if g["cost"] is not None), abs=1e-3)
    table = report(live.two_jobs.url, *minute(live)).stdout
    (line,) = [line for line in table.splitlines() if line.startswith("Counted once: ")]
    assert_mentions(line, f"GPUs 0, 1 on {live.sim_a}", "2 targets", f'{{instance="{live.sim_a}", job="gpu-a"}}',
                    f'{{instance="{live.sim_a}", job="gpu-b"}}')  # fmt: skip
    # The timeline counts each step once too: its steps add up to the totals, but for what the totals
    # leave out where a GPU's extrapolated increases add up past the range (model.build scales such a
    # GPU's hours down to it; the timeline shows the steps as the store answered): under a poll a GPU.
    for h in HOURS[1:]:
        shown = sum(p[h] for p in doc["timeline"])
        assert t[h] - 1e-5 <= shown <= t[h] + t["gpus"] * ONE_POLL_H, (h, shown, t[h])


def test_an_ha_pair_behind_one_store_counts_its_gpus_once(live: Live) -> None:
    """Two Prometheus, replicas r1 and r2, remote-writing one exporter's series into one
    VictoriaMetrics: each GPU the hours and cost of one replica's, and its targets named by replica."""
    doc = as_json(live.pair.url, *minute(live))
    single = by_uuid(as_json(live.pair.url, *minute(live), "--selector", '{replica="r1"}'))
    steps = doc["range"]["hours"] * 3600 / doc["range"]["step_seconds"]
    gpus = by_uuid(doc)
    assert set(gpus) == set(single) and len(gpus) == 2 and doc["totals"]["merged_gpus"] == 2
    for uuid, one in single.items():
        same_as_one_scrape(gpus[uuid], one, int(steps))
        assert gpus[uuid]["targets"] == [{"instance": live.sim_a, "job": "gpu-exporter", "replica": r}
                                         for r in ("r1", "r2")]  # fmt: skip
    named = f'each seen through 2 targets: {{instance="{live.sim_a}", job="gpu-exporter", replica="r1"}}, '
    assert named in report(live.pair.url, *minute(live)).stdout


# -- two hours of hand-made history ----------------------------------------------------------------------------
STEP = 60  # a sample a minute
HOUR = 3600
END = math.floor(time.time() / HOUR) * HOUR - 2 * HOUR
START = END - 2 * HOUR
T0 = START - HOUR  # an hour of history before the range
MOVED_AT, BACK_AT = 3690, 3720  # the exporter of GPU-moved stopped, and started elsewhere (seconds after START)
RESTART_FROM = 3690  # when the new one began counting
PRICE_CHANGE = 3570  # GPU-same on n3: 2.00, then 2.50 (in the step that ends at 60 min)
GAPS = {"r1": (30 * 60, 60 * 60), "r2": (70 * 60, 100 * 60)}  # each replica missed a half-hour


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def history() -> str:
    """OpenMetrics text of two hours, as scrapes every minute would have stored them."""
    lines: list[str] = []

    def series(target: dict[str, str], state: str, holder: dict[str, str], *, price: str | None = None,
               seen: Any = lambda rel: True, counted: Any = lambda rel: rel - (T0 - START)) -> None:  # fmt: skip
        for k in range(3 * HOUR // STEP + 1):
            t = T0 + k * STEP
            rel = t - START
            if not seen(rel):
                continue
            for s in (state, "down"):
                value = counted(rel) if s == state else 0.0
                labels = {**target, **(holder if s == state else {}), "state": s}
                lines.append(f"gpu_state_seconds_total{{{_labels(labels)}}} {value} {t}\n")
            lines.append(f"gpu_info{{{_labels({**target, 'name': 'NVIDIA H100 80GB HBM3'})}}} 1 {t}\n")
            lines.append(f"gpu_memory_total_bytes{{{_labels(target)}}} {80 * 2**30} {t}\n")
            if price is not None:
                p = price if price != "change" else ("2.0" if rel < PRICE_CHANGE else "2.5")
                lines.append(f"gpu_price_per_hour{{{_labels({**target, 'currency': 'USD'})}}} {p} {t}\n")

    pod = {"namespace": "ml", "pod": "a"}
    for job in ("a", "b"):  # one exporter, two scrape jobs: the same samples
        series({"job": job, "instance": "n1:9445", "node": "n1", "gpu": "0", "uuid": "GPU-copies"}, "busy", pod,
               price="3.0")  # fmt: skip
    for replica, (a, b) in GAPS.items():  # an HA pair, each replica missing half an hour at its own time
        series({"job": "gpu", "instance": "n1:9445", "node": "n1", "gpu": "1", "uuid": "GPU-replicas",
                "replica": replica}, "idle", {}, price="1.0", seen=lambda rel, a=a, b=b: not a <= rel < b)  # fmt: skip
    moved = {"job": "gpu", "node": "n2", "gpu": "0", "uuid": "GPU-moved"}
    series({**moved, "instance": "10.0.0.1:9445"}, "busy", pod, seen=lambda rel: rel < MOVED_AT)
    series({**moved, "instance": "10.0.0.2:9445"}, "busy", pod, seen=lambda rel: rel >= BACK_AT,
           counted=lambda rel: rel - RESTART_FROM)  # fmt: skip
    for node, price in (("n3", "change"), ("n4", None)):  # two nodes, one uuid: n4's unpriced
        series({"job": "gpu", "instance": f"{node}:9445", "node": node, "gpu": "0", "uuid": "GPU-same"}, "busy", pod,
               price=price)  # fmt: skip
    for instance in ("x:9445", "y:9445"):  # no uuid, no node label: a GPU per target
        series({"job": "gpu", "instance": instance, "gpu": "0"}, "idle", {})
    return "".join(lines) + "# EOF\n"


@dataclass
class Stores:
    prometheus: Prometheus
    victoriametrics: VictoriaMetrics


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    tmp = tmp_path_factory.mktemp("history")
    text = history()
    (tmp / "history.om").write_text(text)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    out = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"),
                          str(tmp / "prom" / "data")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    with prometheus([], tmp / "prom") as prom, victoria_metrics(tmp / "vm") as vm:
        vm.load(text)
        yield Stores(prom, vm)


ENGINES = ("prometheus", "victoriametrics")
TOLERANCE_H = 45 / 3600  # Prometheus extrapolates a counter's last step by half a scrape (30 s)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_history_counts_each_gpu_once_on_every_engine(stores: Stores, engine: str) -> None:
    """Figures computed by hand, to within 45 s per GPU (Prometheus extrapolates 30 s past the last
    sample of the moved exporter's old address); each would be off by a minute or more if copies
    were added, or an exporter's two addresses not."""
    url = stores.prometheus.url if engine == "prometheus" else stores.victoriametrics.url
    doc = as_json(url, "--start", str(START), "--end", str(END))
    gpus = {(g["node"], g["uuid"]): g for g in doc["gpus"]}
    moved = (MOVED_AT // STEP * STEP + (2 * HOUR - RESTART_FROM)) / 3600  # its samples' count: 3660 s + 3510 s
    expected = {
        # (node, uuid): state, hours, cost (None: no price), targets
        ("n1", "GPU-copies"): ("busy", 2.0, 6.0, [{"instance": "n1:9445", "job": "a"},
                                                   {"instance": "n1:9445", "job": "b"}]),
        ("n1", "GPU-replicas"): ("idle", 2.0, 2.0, [{"instance": "n1:9445", "job": "gpu", "replica": "r1"},
                                                     {"instance": "n1:9445", "job": "gpu", "replica": "r2"}]),
        ("n2", "GPU-moved"): ("busy", moved, None, [{"instance": "10.0.0.1:9445", "job": "gpu"},
                                                     {"instance": "10.0.0.2:9445", "job": "gpu"}]),
        # 2.00 until the step in which the price changed (57 to 60 min), 2.50 from that step on
        ("n3", "GPU-same"): ("busy", 2.0, 2.0 * 0.95 + 2.5 * 1.05, [{"instance": "n3:9445", "job": "gpu"}]),
        ("n4", "GPU-same"): ("busy", 2.0, None, [{"instance": "n4:9445", "job": "gpu"}]),
        ("x:9445", ""): ("idle", 2.0, None, [{"instance": "x:9445", "job": "gpu"}]),
        ("y:9445", ""): ("idle", 2.0, None, [{"instance": "y:9445", "job": "gpu"}]),
    }  # fmt: skip
    assert set(gpus) == set(expected), sorted(gpus)
    for key, (state, hours, cost, targets) in expected.items():
        g = gpus[key]
        assert g[f"{state}_hours"] == pytest.approx(hours, abs=TOLERANCE_H), (key, g[f"{state}_hours"] - hours)
        assert g["gpu_hours"] == pytest.approx(g[f"{state}_hours"], abs=1e-6) and g["gpu_hours"] <= 2.0 + 1e-6, key
        assert (g["cost"] is None) == (cost is None), key
        if cost is not None:
            assert g["cost"] == pytest.approx(cost, abs=0.01), (key, g["cost"])
        assert g["targets"] == targets, key
    t = doc["totals"]
    assert (t["gpus"], t["merged_gpus"], t["unpriced_gpus"]) == (7, 3, 4)
    (pod,) = doc["holders"]  # pod ml/a: GPU-copies, GPU-moved and both GPU-same, once each
    assert (pod["holder"], pod["gpus"]) == ("pod ml/a", 4)
    assert pod["gpu_hours"] == pytest.approx(6.0 + moved, abs=2 * TOLERANCE_H)
