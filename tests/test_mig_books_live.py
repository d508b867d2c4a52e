"""A card in MIG mode keeps books per slice (issue 48, point 1), end to end: the real daemon on the fake
NVML, a real Prometheus scraping it, and ``gpu-exporter report`` reading that Prometheus.

GPU 0 is an H100 cut into seven 1g.10gb slices: two busy (GPM says 80% SM activity), five that Slurm
jobs hold and leave idle (0%), one job per slice.  Before the slices had books of their own, the card
had one state, busy while any slice was, and its time was shared evenly: all seven jobs "busy", the
card 100% busy, nothing wasted, nothing reclaimed.  Now each slice is in its own state at its share
of the card (1/7), five sevenths of the card's cost is wasted, and each idle slice is reclaimed from
its job at a seventh of the card's monthly price.

GPU 1 is an A100 (no GPM: no activity for a MIG slice at all) cut into two 3g.40gb slices, one held by a
job, one by nobody, and a seventh of the card no slice takes: the held slice is "held, activity
unknown" (never busy, never idle), the other and the seventh idle.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import GIB, mig_uuid
from tests.prometheus_helpers import prometheus
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
H100_PRICE, A100_PRICE = 4.00, 2.00  # per hour: the H100 is 2,920 a month
BUSY_GIS, IDLE_GIS = (7, 8), (9, 10, 11, 12, 13)  # an H100's 1g GPU instances, as nvidia-smi numbers them
JOB_OF = {gi: str(100 + gi) for gi in (*BUSY_GIS, *IDLE_GIS)}
A100_HELD, A100_FREE = 1, 2
A100_JOB = "301"


def mig_node(path: Path) -> Scenario:
    s = Scenario(path, comment="H100 in 7 x 1g, 2 busy and 5 held idle; A100 in 2 x 3g, one held")
    h = s.add_gpu().identity(H100, "GPU-4d190000-0000-4000-8000-000000000000").memory(80 * GIB, 14 * GIB)
    h.gpm_supported().mig_mode(True)
    for m, gi in enumerate((*BUSY_GIS, *IDLE_GIS)):
        busy = gi in BUSY_GIS
        h.add_mig(f"{H100} MIG 1g.10gb", mig_uuid("books", 0, m), gi).memory(10 * GIB, 2 * GIB).gpm(
            sm_util=80 if busy else 0
        )
        h.add_process(51_000 + m, 2 * GIB, name="python3", gpu_instance_id=gi, compute_instance_id=0)
    a = s.add_gpu().identity(A100, "GPU-a1000000-0000-4000-8000-000000000000").memory(80 * GIB, 5 * GIB)
    a.mig_mode(True)  # an A100 has no GPM: neither the card nor a slice gives any activity in MIG mode
    for m, gi in enumerate((A100_HELD, A100_FREE)):
        a.add_mig(f"{A100} MIG 3g.40gb", mig_uuid("books", 1, m), gi).memory(40 * GIB, 5 * GIB if m == 0 else 0)
    a.add_process(52_000, 5 * GIB, name="python3", gpu_instance_id=A100_HELD, compute_instance_id=0)
    return s


def config(tmp: Path) -> Path:
    (tmp / "job-map").mkdir()
    for gi, job in JOB_OF.items():  # dcgm-exporter's per-GPU-instance mapping files: <gpu>.<gpu instance>
        (tmp / "job-map" / f"0.{gi}").write_text(f"{job}\n")
    (tmp / "job-map" / f"1.{A100_HELD}").write_text(f"{A100_JOB}\n")
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "node_name": "mig-node",
        "pricing": {"currency": "USD", "models": {"H100": H100_PRICE, "A100": A100_PRICE}},
        "slurm": {"job_mapping_dir": str(tmp / "job-map")},
    }))  # fmt: skip
    return cfg


def books(samples: dict[Any, float], gpu: str) -> dict[tuple[str, str, str], float]:
    """(gpu_instance_id, hpc_job, state) -> seconds, of one GPU's state counters."""
    out: dict[tuple[str, str, str], float] = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        if name == "gpu_state_seconds_total" and d["gpu"] == gpu:
            key = (d.get("gpu_instance_id", ""), d.get("hpc_job", ""), d["state"])
            out[key] = out.get(key, 0.0) + v
    return out


@pytest.fixture(scope="module")
def mig_minute(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Iterator[tuple[Any, Any]]:
    tmp = tmp_path_factory.mktemp("mig-books")
    s = mig_node(tmp / "node.scn")
    s.write()
    # GPM samples a slice at the slow cadence (30 s by default): 1 s here, so that a slice is judged from
    # its second poll on, not after its first half-minute.
    with run_daemon(s.path, "--config", str(config(tmp)), "--poll.interval", "1s", "--poll.slow-interval", "1s") as d, \
            prometheus([f"127.0.0.1:{d.port}"], tmp / "prom", labels={"node": "mig-node"}) as prom:  # fmt: skip
        wait_for(lambda: len(prom.query("count by (gpu) (gpu_state_seconds_total)")) == 2, timeout=NEVER_S,
                 what="the state counters of both GPUs")  # fmt: skip
        started = time.time()
        wait_for(lambda: time.time() - started >= 68, timeout=120, interval=1, what="a minute of history")
        yield d, prom


def report(prom: Any, *args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", prom.url, "--since",
                          "1m", "--selector", '{node="mig-node"}', "--min-history", "30s", *args],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_each_slice_has_its_own_state_and_holder_on_metrics(mig_minute: tuple[Any, Any]) -> None:
    d, _ = mig_minute
    before = books(d.metrics(), "0")
    wait_for(lambda: sum(books(d.metrics(), "0").values()) >= sum(before.values()) + 2, timeout=NEVER_S,
             what="two more seconds of books")  # fmt: skip
    h100 = books(d.metrics(), "0")
    moved = {k: v for k, v in h100.items() if v > 0}
    # GPM gives a slice's activity from its second sample on: until then (the daemon's first polls) each
    # held slice is held with its activity unknown, never busy or idle; after, it no longer grows.
    unknown = {k for k in moved if k[2] == "allocated_unknown"}
    assert all(h100[k] == before.get(k) for k in unknown), (before, h100)
    assert all(h100[k] > before[k] for k in set(moved) - unknown)
    busy = {(str(gi), JOB_OF[gi], "busy") for gi in BUSY_GIS}
    assert set(moved) - unknown == busy | {(str(gi), JOB_OF[gi], "allocated_idle") for gi in IDLE_GIS}
    # Each slice at a seventh of the card: the card's series add up to its time, each slice's to 1/7 of it.
    card = sum(h100.values())
    for gi, job, _ in moved:
        assert sum(v for (g, _, _), v in h100.items() if g == gi) == pytest.approx(card / 7, rel=1e-9), (gi, job)


def test_an_a100_slice_held_without_gpm_is_held_activity_unknown(mig_minute: tuple[Any, Any]) -> None:
    d, _ = mig_minute
    a100 = books(d.metrics(), "1")
    moved = {k for k, v in a100.items() if v > 0}
    # The held slice neither busy nor idle; the free one idle; the seventh no slice takes idle, held by nobody.
    assert moved == {(str(A100_HELD), A100_JOB, "allocated_unknown"), (str(A100_FREE), "", "idle"), ("", "", "idle")}
    card = sum(a100.values())
    assert a100[(str(A100_HELD), A100_JOB, "allocated_unknown")] == pytest.approx(card * 3 / 7, rel=1e-9)
    assert a100[("", "", "idle")] == pytest.approx(card / 7, rel=1e-9)


def test_the_report_shows_each_slice_its_waste_and_reclaims_each_idle_one(mig_minute: tuple[Any, Any]) -> None:
    _, prom = mig_minute
    doc = json.loads(report(prom, "--format", "json"))
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    h100 = gpus["0"]
    # Five sevenths of the card held idle, and five sevenths of its cost wasted.
    assert h100["allocated_idle_hours"] == pytest.approx(h100["gpu_hours"] * 5 / 7, rel=0.01)
    assert h100["busy_hours"] == pytest.approx(h100["gpu_hours"] * 2 / 7, rel=0.01)
    assert h100["wasted_cost"] == pytest.approx(h100["cost"] * 5 / 7, rel=0.01)
    slices = {x["gpu_instance_id"]: x for x in h100["slices"]}
    assert set(slices) == {str(gi) for gi in (*BUSY_GIS, *IDLE_GIS)}
    for gi in (*BUSY_GIS, *IDLE_GIS):
        x = slices[str(gi)]
        assert x["share"] == pytest.approx(1 / 7, abs=1e-3) and x["holder"].startswith(f"job {JOB_OF[gi]}")
        assert (x["busy_hours"] > 0, x["allocated_idle_hours"] > 0) == (gi in BUSY_GIS, gi in IDLE_GIS)
        assert x["cost"] == pytest.approx(h100["cost"] / 7, rel=0.01)
    # A reclaim per idle slice, from its own job, at a seventh of the card's month; never the card released.
    recs = [r for r in doc["recommendations"] if r["gpu"] == "0"]
    assert sorted(r["gpu_instance_id"] for r in recs) == sorted(str(gi) for gi in IDLE_GIS)
    for r in recs:
        assert r["kind"] == "reclaim" and r["suggested"].startswith(
            f"reclaim from job {JOB_OF[int(r['gpu_instance_id'])]}"
        )
        assert r["saving_per_month"] == pytest.approx(H100_PRICE * 730 / 7, rel=0.01)
        assert f"MIG slice {r['gpu_instance_id']} (1/7 of the card) of GPU 0" in r["reason"]
    assert sum(r["saving_per_month"] for r in recs) == pytest.approx(2085.71, rel=0.01)
    assert not any(r["kind"] == "release" for r in doc["recommendations"])
    # The card, busy on two slices, is not sized as a card, and says so (issue 48, item 6).
    assert [n for n in h100["notes"] if n.startswith("not sized") and "MIG mode" in n], h100["notes"]


def test_the_report_says_an_a100_slice_is_held_with_its_activity_unknown(mig_minute: tuple[Any, Any]) -> None:
    _, prom = mig_minute
    doc = json.loads(report(prom, "--format", "json"))
    a100 = {g["gpu"]: g for g in doc["gpus"]}["1"]
    held = {x["gpu_instance_id"]: x for x in a100["slices"]}[str(A100_HELD)]
    assert held["allocated_unknown_hours"] > 0 and held["busy_hours"] == held["allocated_idle_hours"] == 0
    assert a100["allocated_unknown_hours"] == pytest.approx(a100["gpu_hours"] * 3 / 7, rel=0.01)
    assert doc["totals"]["allocated_unknown_hours"] == pytest.approx(a100["allocated_unknown_hours"], rel=1e-6)
    assert not [r for r in doc["recommendations"] if r["gpu"] == "1" and r["kind"] == "reclaim"]
    text = report(prom, "--format", "table")
    assert "Held, activity unknown:" in text and "MIG slices" in text
