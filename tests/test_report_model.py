"""The report's figures from what Prometheus answers (``report.model.build``), where the answers are
not the tidy week of test_report_history: a GPU replaced during the range, series without a uuid or
node label (another exporter, an older gpu-exporter), an exporter that restarted on a new address,
GPUs in MIG mode, indices past 9, float noise around zero.

Each test gives ``build`` the query results as the client returns them: (labels, value) pairs, with
the labels Prometheus keeps (an empty label is no label)."""

from __future__ import annotations

import json
from typing import Any

from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import window_for

GIB = 1024**3
END = 1_796_000_400.0  # a whole hour
START = END - 100 * 3600  # 100 h
W = window_for(START, END)
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
CATALOGUE = load_catalogue()


def empty() -> dict[str, Any]:
    return {k: [] for k in ("hours", "prices", "info", "memory_total", "memory_peak", "activity", "timeline")}


def add_gpu(r: dict[str, Any], key: dict[str, str], model: str, hours: dict[str, float], *, price: float | None = None,
            holder: dict[str, str] | None = None, peak: float | None = None, total: float = 80 * GIB,
            activity: float | None = None, mig_mode: str = "disabled") -> None:  # fmt: skip
    """One GPU's answers: its hours by state (held ones by ``holder``), one price all range long."""
    for state, h in hours.items():
        held = holder if holder and state in ("busy", "allocated_idle") else {}
        r["hours"].append(({**key, **held, "state": state}, h))
    if price is not None:
        for stat, v in (("max", price), ("min", price), ("count", W.points)):
            r["prices"].append(({**key, "currency": "USD", "stat": stat}, v))
    r["info"].append(({**key, "name": model, "mig_mode": mig_mode}, 1.0))
    r["memory_total"].append((key, total))
    if peak is not None:
        r["memory_peak"].append((key, peak))
    if activity is not None:
        r["activity"].append(({**key, "signal": "sm_active"}, activity))


def rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str | None, float]]:
    return [(g["node"], g["gpu"], g["uuid"], g["model"], g["gpu_hours"]) for g in doc["gpus"]]


def test_a_gpu_replaced_during_the_range_is_two_gpus() -> None:
    """Node n1's GPU 0 was an H100 for 60 h, then a new card (a new UUID) at the same index: each is a
    GPU of its own, with its own model, hours and cost, not one GPU with the hours of both."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-old"}, H100, {"busy": 60.0}, price=3.0)
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-new"}, L4, {"idle": 40.0}, price=0.8)
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("n1", "0", "GPU-new", L4, 40.0), ("n1", "0", "GPU-old", H100, 60.0)]
    assert [g["cost"] for g in doc["gpus"]] == [32.0, 180.0]
    assert doc["totals"]["gpus"] == 2 and doc["totals"]["cost"] == 212.0


def test_series_without_a_uuid_are_one_gpu_per_node_and_index_whatever_the_instance() -> None:
    """Without a uuid label, a GPU is its node and index: n1's GPU 0, whose exporter restarted on a new
    address half-way (a new ``instance``), is still one GPU with 100 h; n1's GPU 1 and n2's GPU 0 are others."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "10.0.0.1:9445", "gpu": "0"}, H100, {"busy": 50.0}, price=3.0)
    r["hours"].append(({"node": "n1", "instance": "10.0.0.7:9445", "gpu": "0", "state": "busy"}, 50.0))
    add_gpu(r, {"node": "n1", "instance": "10.0.0.7:9445", "gpu": "1"}, H100, {"idle": 100.0})
    add_gpu(r, {"node": "n2", "instance": "10.0.0.2:9445", "gpu": "0"}, L4, {"down": 100.0})
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("n1", "0", "", H100, 100.0), ("n1", "1", "", H100, 100.0), ("n2", "0", "", L4, 100.0)]
    assert doc["totals"]["gpus"] == 3


def test_series_without_a_node_label_are_told_apart_by_instance() -> None:
    """Scraped without the node label (no relabelling), GPUs are their exporter's address and index,
    and the report names the node by that address."""
    r = empty()
    add_gpu(r, {"instance": "a:9445", "gpu": "0"}, H100, {"busy": 100.0})
    add_gpu(r, {"instance": "b:9445", "gpu": "0"}, H100, {"allocated_idle": 100.0})
    add_gpu(r, {"instance": "b:9445", "gpu": "1"}, L4, {"idle": 100.0})
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("a:9445", "0", "", H100, 100.0), ("b:9445", "0", "", H100, 100.0),
                         ("b:9445", "1", "", L4, 100.0)]  # fmt: skip
    assert [(g["busy_hours"], g["allocated_idle_hours"], g["idle_hours"]) for g in doc["gpus"]] == [
        (100.0, 0.0, 0.0), (0.0, 100.0, 0.0), (0.0, 0.0, 100.0)]  # fmt: skip


def test_gpus_are_listed_by_node_then_index_in_numbers() -> None:
    """GPU 2 before GPU 10 (not as text), and an index that is no number (a MIG device "0/1") after them."""
    r = empty()
    for gpu in ("10", "2", "0/1", "0"):
        add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": gpu, "uuid": f"GPU-{gpu}"}, H100, {"idle": 100.0})
    add_gpu(r, {"node": "n0", "instance": "n0:9445", "gpu": "3", "uuid": "GPU-n0"}, H100, {"idle": 100.0})
    doc = build(W, r, CATALOGUE)
    assert [(g["node"], g["gpu"]) for g in doc["gpus"]] == [("n0", "3"), ("n1", "0"), ("n1", "2"), ("n1", "10"),
                                                            ("n1", "0/1")]  # fmt: skip


def test_a_gpu_in_mig_mode_at_any_point_of_the_range_gets_no_card() -> None:
    """A light job on an H100 is told of a smaller card; the same GPU, in MIG mode for part of the range
    (two info series), is not: its slices were sized by someone, and the report cannot see each one's use."""

    def light(mig: list[str]) -> dict[str, Any]:
        r = empty()
        key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
        add_gpu(r, key, H100, {"busy": 100.0}, price=3.0, holder={"namespace": "ml", "pod": "a"}, peak=6 * GIB,
                activity=0.05, mig_mode=mig[0])  # fmt: skip
        r["info"] += [({**key, "name": H100, "mig_mode": m}, 1.0) for m in mig[1:]]
        return r

    advised = build(W, light(["disabled"]), CATALOGUE)["recommendations"]
    assert [x["suggested"] for x in advised] == ["A100 80GB MIG 1g.10gb"]
    for mig in (["enabled"], ["enabled", "disabled"], ["disabled", "enabled"]):
        assert build(W, light(mig), CATALOGUE)["recommendations"] == [], mig


def test_float_noise_below_zero_is_reported_as_zero_not_minus_zero() -> None:
    """increase() and sums of products can land a hair below zero; the report says 0.0, never -0.0."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100,
            {"busy": 100.0, "allocated_idle": -1e-12}, price=3.0, holder={"namespace": "ml", "pod": "a"})  # fmt: skip
    r["timeline"] = [({"state": "busy"}, [(END, 1.0)]), ({"state": "allocated_idle"}, [(END, -1e-12)])]
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["allocated_idle_hours"], g["wasted_cost"]) == (0.0, 0.0)
    assert "-0.0" not in json.dumps(doc), json.dumps(doc)
