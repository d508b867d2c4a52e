"""Four hours of four GPUs scraped every 15 s, with scrape gaps, as gpu-exporter would have exported
them: backfilled into a real Prometheus (``promtool tsdb create-blocks-from openmetrics``) and
imported into a real VictoriaMetrics, the same samples in both (issue 48, item 2).

Each GPU is an H100 at 3.00 USD an hour on a node of its own, held by a pod all the range:
- n-whole: every scrape.
- n-minute: a minute of failed scrapes (4 of them) 1 h 20 min in; the exporter kept counting.
- n-ten: ten minutes of failed scrapes 2 h 1 min in, busy until 5 minutes into the gap and held idle
  after it; the exporter kept counting.
- n-restart: ten minutes of failed scrapes 2 h 31 min in, in which the exporter stopped 3 minutes in
  and started again 4 minutes later: its counters start again from 0, and the 4 minutes it was down
  nobody counted.
- n-copied: ten minutes of failed scrapes, busy and then held idle as n-ten, while another job (a
  federation's, ``COPIES``) copied the GPU's series all along: the copy counts the gap, and the
  exporter's own job, whose counters carry the gap too, must not count it again.
- n-both: ten minutes in which both jobs' scrapes failed (the store was down).

The scrapes fall 7 s past each 15 s, as a real scraper's phase does, never on a step's edge; the
copy's 2 s past, before the own job's, so that its readings before a gap are older than the own job's.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.prometheus_helpers import Prometheus, VictoriaMetrics, prometheus, victoria_metrics

HOUR = 3600
SCRAPE = 15
PHASE = 7
END = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR
START = END - 4 * HOUR
T0 = START - HOUR  # an hour of history before the range
T1 = END + 10 * 60  # and some after it
PRICE = 3.0
H100 = "NVIDIA H100 80GB HBM3"
GIB = 1024**3


@dataclass(frozen=True)
class Gap:
    start: float  # seconds after START: the first scrape that fails
    seconds: float  # how long the scrapes fail
    down: tuple[float, float] | None = None  # (from, to) seconds into the gap the exporter was not running
    idle_from: float | None = None  # seconds into the gap the pod stopped using the GPU (held idle after)

    @property
    def at(self) -> float:
        return START + self.start


GAPS: dict[str, Gap | None] = {
    "n-whole": None,
    "n-minute": Gap(HOUR + 20 * 60, 60),
    "n-ten": Gap(2 * HOUR + 60, 600, idle_from=300),
    "n-restart": Gap(2 * HOUR + 31 * 60, 600, down=(180, 420)),
    "n-copied": Gap(3 * HOUR + 7 * 60, 600, idle_from=300),
    "n-both": Gap(3 * HOUR + 23 * 60, 600),
}
# The nodes whose series another job copied (a federation), with the copy's own scrape gap.
COPIES: dict[str, Gap | None] = {"n-copied": None, "n-both": GAPS["n-both"]}
COPY_PHASE = 2


def state_at(node: str, t: float) -> str:
    gap = GAPS[node]
    if gap is not None and gap.idle_from is not None and t >= gap.at + gap.idle_from:
        return "allocated_idle"
    return "busy"


def truth(node: str) -> dict[str, float]:
    """The seconds of each state in [START, END) that the exporter counted (all of them, where it never
    stopped)."""
    gap = GAPS[node]
    if gap is not None and gap.idle_from is not None:
        switch = gap.at + gap.idle_from
        return {"busy": switch - START, "allocated_idle": END - switch}
    lost = 0.0 if gap is None or gap.down is None else gap.down[1] - gap.down[0]
    return {"busy": END - START - lost}


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(d.items()))


def history() -> str:
    """OpenMetrics text of the scrapes that succeeded, each with the counters as the exporter had them
    when it was scraped: the own job's and, for ``COPIES``, the copy's."""
    out: list[str] = []
    for node, gap in GAPS.items():
        base = {"node": node, "gpu": "0", "uuid": f"GPU-{node}-0"}
        own = {"job": "gpu-exporter", "instance": f"{node}:9445"}
        scrapers = [(own, PHASE, gap)]
        if node in COPIES:  # a federation's copy: its own job and instance, the exporter's kept aside
            copy = {"job": "federate", "instance": "central:9090", "exported_job": "gpu-exporter",
                    "exported_instance": f"{node}:9445"}  # fmt: skip
            scrapers.append((copy, COPY_PHASE, COPIES[node]))
        for target, phase, failed in scrapers:
            series: dict[str, list[str]] = {}
            for t, counters in readings(node, gap, phase):
                if failed is not None and failed.at <= t < failed.at + failed.seconds:
                    continue  # the scrape failed
                _scrape(series, {**base, **target}, t, counters)
            for name, samples in series.items():
                out += [f"{name} {s}\n" for s in samples]
    return "".join(out) + "# EOF\n"


def readings(node: str, gap: Gap | None, phase: int) -> Iterator[tuple[int, dict[str, float]]]:
    """The exporter's counters at each scrape time of a scraper of this phase, every second counted while
    it ran (scraped or not)."""
    counters: dict[str, float] = {"busy": 0.0, "allocated_idle": 0.0, "idle": 0.0, "down": 0.0}
    t_prev = T0 - SCRAPE + PHASE  # one counter, whoever reads it: from the exporter's start
    for k in range(int((T1 - T0) / SCRAPE)):
        t = T0 + phase + k * SCRAPE
        for sec in range(int(t_prev), int(t)):
            if gap is not None and gap.down is not None and gap.at + gap.down[0] <= sec < gap.at + gap.down[1]:
                continue
            if gap is not None and gap.down is not None and sec == gap.at + gap.down[1]:
                counters = dict.fromkeys(counters, 0.0)  # a new process: its counters from 0
            counters[state_at(node, sec)] += 1
        t_prev = t
        yield t, dict(counters)


def _scrape(series: dict[str, list[str]], base: dict[str, str], t: int, counters: dict[str, float]) -> None:
    pod = {"namespace": "ml", "pod": f"train-{base['node']}", "container": "main"}
    for state, v in counters.items():
        labels = {**base, **(pod if state in ("busy", "allocated_idle") else {}), "state": state, "user": ""}
        series.setdefault(f"gpu_state_seconds_total{{{_labels(labels)}}}", []).append(f"{v} {t}")
    held = {**base, **pod}
    series.setdefault(f"gpu_price_per_hour{{{_labels({**held, 'currency': 'USD'})}}}", []).append(f"{PRICE} {t}")
    series.setdefault(f"gpu_info{{{_labels({**held, 'name': H100, 'mig_mode': 'disabled'})}}}", []).append(f"1 {t}")
    series.setdefault(f"gpu_memory_total_bytes{{{_labels(held)}}}", []).append(f"{80 * GIB} {t}")
    series.setdefault(f"gpu_memory_used_max_bytes{{{_labels(held)}}}", []).append(f"{40 * GIB} {t}")
    series.setdefault(f"gpu_sm_active_ratio{{{_labels(held)}}}", []).append(f"0.6 {t}")


@dataclass
class Stores:
    prometheus: Prometheus
    victoriametrics: VictoriaMetrics

    def urls(self) -> dict[str, str]:
        return {"prometheus": self.prometheus.url, "victoriametrics": self.victoriametrics.url}


@contextmanager
def stores(tmp: Path) -> Iterator[Stores]:
    """The four hours in a Prometheus and a VictoriaMetrics, both on 127.0.0.1."""
    text = history()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    (tmp / "gaps.om").write_text(text)
    made = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "gaps.om"),
                           str(tmp / "prom" / "data")], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    with prometheus([], tmp / "prom") as prom, victoria_metrics(tmp / "vm") as vm:
        vm.load(text)
        yield Stores(prom, vm)
