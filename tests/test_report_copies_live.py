"""Copies that disagree are not one GPU (issue 48 item 4, issue 50 item 6a), against real stores.

Two hours of hand-made samples, as scrapes every minute would have stored them, backfilled into
Prometheus (promtool) and imported into VictoriaMetrics:

- node n1's GPUs 0 and 1, scraped by the exporter's own job (``gpu-exporter``), held busy by pod
  ml/victim at 3.00 an hour; a pod scraped by another job (``kubernetes-pods``) writes series with
  their ``node``, ``gpu`` and ``uuid`` labels and another holder, pod evil/forger, counting as fast:
  with the unheld "down" series for GPU 0, without it for GPU 1 (so that the "seen" query, which reads
  "down", never shows it);
- node n2's GPU, scraped by the own job and by a federating job with the same holders: an honest
  double scrape;
- node n3's GPU, held for an hour by the system Docker's container and for the next by user 1000's
  rootless Docker container of the same ID, as the exporter writes them (``container_engine`` docker
  and docker@1000).

Before: each copy's largest increase per (GPU, holder, state) kept the forger's holder beside the
victim's, the GPU's 4 h were scaled down to its 2 h, and half the victim's hours and cost became the
forger's, with a note blaming "one exporter scraped twice"; the two containers were one holder.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.report.queries import LAG
from tests.prometheus_helpers import Prometheus, VictoriaMetrics, prometheus, victoria_metrics

pytestmark = pytest.mark.integration

STEP = 60  # a sample a minute
HOUR = 3600
END = math.floor(time.time() / HOUR) * HOUR - 2 * HOUR
START = END - 2 * HOUR
T0 = START - HOUR  # an hour of history before the range
CID = "fedcba987654" + "1" * 52
OWN = {"job": "gpu-exporter", "instance": "n1:9445"}
FORGER = {"job": "kubernetes-pods", "instance": "10.1.2.3:8080"}
VICTIM = {"namespace": "ml", "pod": "victim", "container": "main"}
EVIL = {"namespace": "evil", "pod": "forger", "container": "main"}
TOLERANCE_H = 45 / 3600  # Prometheus extrapolates a counter's last step by half a scrape


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def history(t0: int = T0, end: int = END, step: int = STEP, forgery_only: bool = False) -> str:
    """OpenMetrics text of the samples from ``t0`` to ``end``, one every ``step`` seconds."""
    lines: list[str] = []

    def series(labels: dict[str, str], counted: Any, *, down: bool = True, price: float | None = None) -> None:
        for k in range((end - t0) // step + 1):
            t = t0 + k * step
            lines.append(f"gpu_state_seconds_total{{{_labels(labels)}}} {counted(t)} {t}\n")
            target = {k: v for k, v in labels.items() if k in ("job", "instance", "node", "gpu", "uuid")}
            if down:
                lines.append(f"gpu_state_seconds_total{{{_labels({**target, 'state': 'down'})}}} 0 {t}\n")
            if price is not None:
                lines.append(f"gpu_price_per_hour{{{_labels({**target, 'currency': 'USD'})}}} {price} {t}\n")

    def always(t: int) -> float:
        return float(t - t0)

    for gpu, forged_down in (("0", True), ("1", False)):
        gpu_labels = {"node": "n1", "gpu": gpu, "uuid": f"GPU-victim{gpu}"}
        series({**OWN, **gpu_labels, **VICTIM, "state": "busy"}, always, price=3.0)
        series({**FORGER, **gpu_labels, **EVIL, "state": "busy"}, always, down=forged_down)
    if forgery_only:
        return "".join(lines) + "# EOF\n"
    honest = {"node": "n2", "gpu": "0", "uuid": "GPU-honest"}
    for job in ("gpu-exporter", "federate"):
        series({"job": job, "instance": "n2:9445", **honest, **VICTIM, "state": "busy"}, always, price=3.0)
    box = {"job": "gpu-exporter", "instance": "n3:9445", "node": "n3", "gpu": "0", "uuid": "GPU-box"}
    system = {"container_engine": "docker", "container_id": CID[:12], "container_name": CID[:12]}
    rootless = {**system, "container_engine": "docker@1000"}
    series({**box, **system, "state": "busy"}, lambda t: float(min(t, START + HOUR) - T0), price=2.0)
    series({**box, **rootless, "state": "allocated_idle"}, lambda t: float(max(t - START - HOUR, 0)), down=False)
    return "".join(lines) + "# EOF\n"


@dataclass
class Stores:
    prometheus: Prometheus
    victoriametrics: VictoriaMetrics


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    tmp = tmp_path_factory.mktemp("copies")
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


def report(url: str, fmt: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--quiet",
                          "--start", str(START), "--end", str(END), "--format", fmt],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


ENGINES = ("prometheus", "victoriametrics")


def url_of(stores: Stores, engine: str) -> str:
    return stores.prometheus.url if engine == "prometheus" else stores.victoriametrics.url


@pytest.mark.parametrize("engine", ENGINES)
def test_a_forged_copy_from_another_job_takes_nothing_from_the_victim(stores: Stores, engine: str) -> None:
    """The victim keeps its 2 h and 6.00 on each GPU, with or without the forger's "down" series; the
    forger's pod holds nothing; each GPU names the forger's target and the own job's, in every format."""
    doc = json.loads(report(url_of(stores, engine), "json"))
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    holders = {h["holder"]: h for h in doc["holders"]}
    assert "pod evil/forger" not in holders, holders
    victim = holders["pod ml/victim"]
    # GPU-victim0, GPU-victim1 and the honest double scrape's GPU, 2 h each at 3.00
    assert victim["gpu_hours"] == pytest.approx(6.0, abs=3 * TOLERANCE_H) and victim["gpus"] == 3
    assert victim["cost"] == pytest.approx(18.0, abs=0.05)
    forger = {"instance": FORGER["instance"], "job": FORGER["job"]}
    for uuid in ("GPU-victim0", "GPU-victim1"):
        g = gpus[uuid]
        assert (g["holder"], g["busy_hours"]) == ("pod ml/victim", pytest.approx(2.0, abs=TOLERANCE_H)), g
        assert g["cost"] == pytest.approx(6.0, abs=0.05) and g["gpu_hours"] <= 2.0 + 1e-6
        assert g["targets"] == ([{"instance": "n1:9445", "job": "gpu-exporter"}])  # the forger's is not counted once
        (left,) = g["left_out_targets"]
        assert {k: v for k, v in left.items() if k != "hours"} == forger
        assert left["hours"] == pytest.approx(2.0, abs=TOLERANCE_H)
        (note,) = [n for n in g["notes"] if "disagree" in n]
        assert '{instance="10.1.2.3:8080", job="kubernetes-pods"}' in note
        assert '{instance="n1:9445", job="gpu-exporter"}' in note and "scraped twice" not in note
    for fmt in ("table", "markdown", "html"):
        shown = report(url_of(stores, engine), fmt)
        for named in ("10.1.2.3:8080", "kubernetes-pods", "n1:9445", "disagree"):
            assert named in shown, (fmt, named)
        assert "GPU 0 on n1, seen through" not in shown  # not "counted once" with the forger's copy


@pytest.mark.parametrize("engine", ENGINES)
def test_an_honest_double_scrape_is_still_counted_once(stores: Stores, engine: str) -> None:
    """The own job and a federating job with the same holders: one GPU of 2 h at 6.00, no note."""
    doc = json.loads(report(url_of(stores, engine), "json"))
    (g,) = [g for g in doc["gpus"] if g["uuid"] == "GPU-honest"]
    assert g["gpu_hours"] == pytest.approx(2.0, abs=TOLERANCE_H) and g["gpu_hours"] <= 2.0 + 1e-6
    assert g["cost"] == pytest.approx(6.0, abs=0.05)
    # No note of copies or targets (the advice may still say why it sized nothing: "not sized: ...").
    assert ([n for n in g["notes"] if not n.startswith("not sized")], g["left_out_targets"]) == ([], [])
    assert g["targets"] == [{"instance": "n2:9445", "job": "federate"}, {"instance": "n2:9445", "job": "gpu-exporter"}]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rootless_container_and_the_system_engines_of_one_id_are_two_holders(stores: Stores,
                                                                                engine: str) -> None:  # fmt: skip
    """An hour each: the system Docker's container busy, user 1000's of the same ID allocated but idle."""
    doc = json.loads(report(url_of(stores, engine), "json"))
    containers = [h for h in doc["holders"] if h["kind"] == "container"]
    assert len(containers) == 2, containers  # not one container of 2 h
    rows = {h["container_engine"]: h for h in containers}
    assert set(rows) == {"docker", "docker@1000"}
    system, rootless = rows["docker"], rows["docker@1000"]
    assert system["busy_hours"] == pytest.approx(1.0, abs=TOLERANCE_H) and system["allocated_idle_hours"] == 0
    assert rootless["allocated_idle_hours"] == pytest.approx(1.0, abs=TOLERANCE_H) and rootless["busy_hours"] == 0
    assert system["cost"] == pytest.approx(2.0, abs=0.05) and rootless["cost"] == pytest.approx(2.0, abs=0.05)
    assert rootless["wasted_cost"] == pytest.approx(2.0, abs=0.05)
    assert rootless["holder"] == f"container {CID[:12]} (docker@1000)"


# -- the recorded path (alerts/gpu-report.rules.yml): a day of hourly series ---------------------------------
RULES = Path(__file__).resolve().parent.parent / "alerts" / "gpu-report.rules.yml"
R_STEP = 1200  # a sample every 20 minutes: the raw path steps by an hour too, as the recorded one does
R_END = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR  # its hours recorded before now
R_START = R_END - 24 * HOUR
R_T0 = R_START - 2 * HOUR


def promtool(*args: str) -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.fixture(scope="module")
def recorded_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """The forgery over a day, and the recording rules evaluated on it and backfilled next to it."""
    tmp = tmp_path_factory.mktemp("copies-recorded")
    (tmp / "history.om").write_text(history(R_T0, R_END, R_STEP, forgery_only=True))
    promtool("tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "prom" / "data"))
    with prometheus([], tmp / "prom") as prom:
        promtool("tsdb", "create-blocks-from", "rules", f"--url={prom.url}", f"--start={R_START}",
                 f"--end={R_END + LAG}", f"--output-dir={tmp / 'rules'}", str(RULES))  # fmt: skip
    for block in (tmp / "rules").iterdir():
        shutil.move(str(block), tmp / "prom" / "data" / block.name)
    with prometheus([], tmp / "prom") as prom:
        yield prom


@pytest.mark.parametrize("mode", ["yes", "no"])
def test_the_recorded_hours_keep_the_victims_too(recorded_store: Prometheus, mode: str) -> None:
    """Read from the hourly recorded series (``yes``) as from the raw ones (``no``): each GPU's 24 h and
    72.00 are the victim's, none the forger's, and the forger's target is named."""
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", recorded_store.url,
                          "--quiet", "--start", str(R_START), "--end", str(R_END), "--format", "json",
                          "--prometheus.recorded", mode], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (victim,) = doc["holders"]
    assert (victim["holder"], victim["gpus"]) == ("pod ml/victim", 2)
    assert victim["gpu_hours"] == pytest.approx(48.0, abs=1e-6) and victim["cost"] == pytest.approx(144.0, abs=1e-4)
    for g in doc["gpus"]:
        assert [{k: v for k, v in t.items() if k != "hours"} for t in g["left_out_targets"]] == [
            {"instance": FORGER["instance"], "job": FORGER["job"]}], g  # fmt: skip
