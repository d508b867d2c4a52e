"""The ``--once`` JSON holds what /metrics holds, each metric in the one shape its declaration gives.

A simulated node (one GPU of each profile: MIG, a lost GPU with its XIDs, processes, NVLink) is
polled through a lost period; each snapshot is rendered as /metrics, parsed back with
prometheus_client's parser, and every series is looked up in the JSON at the path the README
documents for its metric.  The JSON may hold nothing /metrics does not.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.metric_defs import METRICS, MetricDef, Scope, series_names
from gpu_exporter.once import as_json
from gpu_exporter.serving.exposition import render_text
from gpu_exporter.serving.metrics import RenderOptions, SnapshotCollector, labels_of
from gpu_exporter.snapshot import JobRef, NodeSnapshot, PodRef
from gpu_exporter.sources.poller import Poller
from gpu_exporter.sources.simulated import LOST_PERIOD_SECONDS, LOST_WINDOW_SECONDS, PROFILES, SimulatedBackend

STEP = 30.0
NUMERIC = {"pid", "gpu_instance_id", "compute_instance_id"}
OPTIONS = {
    "holders": RenderOptions(jobs=True, containers=True),
    "pods": RenderOptions(pod_labels=("namespace", "pod", "container")),
    "capped, collectors off": RenderOptions(process_top_n=1, disabled=frozenset({"nvlink", "clocks"})),
}


@pytest.fixture(scope="module")
def snapshots() -> list[NodeSnapshot]:
    """One lost period of the simulated node, every GPU also held by a pod and a job (the simulator
    has neither), so that holder labels are on some series and empty on others."""
    now = [1_700_000_000.0]
    backend = SimulatedBackend(len(PROFILES), clock=lambda: now[0], node="sim")
    poller = Poller(backend, errors=lambda function, error: None, wall_clock=lambda: now[0], monotonic=lambda: now[0])
    out = []
    try:
        for _ in range(int(LOST_PERIOD_SECONDS // STEP)):
            s = poller.poll()
            held = tuple(dataclasses.replace(g, pods=(PodRef("ml", f"train-{g.index}", "main", uid="u-1"),),
                                             jobs=(JobRef(str(4200 + g.index), "alice"),)) if g.up and g.index % 2
                         else g for g in s.gpus)  # fmt: skip
            out.append(dataclasses.replace(s, gpus=held))
            now[0] += STEP
    finally:
        poller.close()
    start, end = LOST_WINDOW_SECONDS
    assert any(not g.up for s in out for g in s.gpus), "the lost profile never went down"
    assert end - start >= STEP
    return out


def exposition(snapshot: NodeSnapshot, opts: RenderOptions) -> Iterator[tuple[MetricDef, dict[str, str], float]]:
    collector = SnapshotCollector(opts)
    collector.snapshot = snapshot
    registry = CollectorRegistry()
    registry.register(collector)
    names = series_names()
    for fam in text_string_to_metric_families(render_text(registry).decode()):
        for s in fam.samples:
            yield METRICS[names[s.name]], s.labels, float(s.value)


def number(d: MetricDef, v: float) -> float | int:
    return int(v) if d.unit in ("", "bytes") and v.is_integer() else v


def entry(d: MetricDef, opts: RenderOptions, labels: dict[str, str], v: float) -> dict[str, Any]:
    """A list entry as the README says: every label beyond gpu and uuid, null where empty, then value."""
    out: dict[str, Any] = {}
    for k in labels_of(d, opts)[2:]:
        x = labels.get(k, "")
        out[k] = None if not x else int(x) if k in NUMERIC else x
    return out | {"value": number(d, v)}


def counted(name: str, value: Any) -> int:
    return len(value) if isinstance(value, dict | list) and name != "gpu_info" else 1


@pytest.mark.parametrize("opts", OPTIONS.values(), ids=OPTIONS.keys())
def test_every_series_of_metrics_is_in_the_json_at_its_declared_place(
    snapshots: list[NodeSnapshot], opts: RenderOptions
) -> None:
    shapes: set[str] = set()
    lost = [s for s in snapshots if not all(g.up for g in s.gpus)]
    for snap in [*snapshots[::5], lost[0], lost[-1]]:  # a few of each, to keep the fast tier fast
        gpus = {g["gpu"]: g for g in json.loads(as_json(snap, [], opts))["gpus"]}
        series = 0
        for d, labels, v in exposition(snap, opts):
            g = gpus[int(labels["gpu"])]
            assert g["uuid"] == (labels["uuid"] or None)
            got = g[d.name]
            series += 1
            if d.name == "gpu_info":
                assert got == {k: labels.get(k) or None for k in d.labels}
                shapes.add("info")
            elif d.scope == Scope.GPU and not d.holder and not d.pods and not d.labels:
                assert got == number(d, v) and type(got) is type(number(d, v)), d.name
                shapes.add("number")
            elif d.scope == Scope.GPU and not d.holder and not d.pods and len(d.labels) == 1:
                assert got[labels[d.labels[0]]] == number(d, v), d.name
                shapes.add("by label")
            else:
                assert entry(d, opts, labels, v) in got, d.name
                assert all(e.keys() == entry(d, opts, labels, v).keys() for e in got), f"{d.name}: keys differ"
                shapes.add("list")
        # Nothing beyond: every metric value in the JSON is one of the series above.
        shown = sum(counted(k, v) for g in gpus.values() for k, v in g.items() if k in METRICS)
        assert shown == series
        assert all(k in METRICS or k in ("gpu", "uuid", "up", "error", "state") for g in gpus.values() for k in g)
        for g in gpus.values():
            assert g["up"] is (g.get("gpu_up") == 1)
            if not g["up"]:
                assert g["error"] and {k for k in g if k in METRICS} <= {"gpu_up", "gpu_xid_errors_total"}
    assert shapes == {"info", "number", "by label", "list"}


def test_a_lost_gpu_keeps_its_identity_and_its_xids(snapshots: list[NodeSnapshot]) -> None:
    down = [(s, g) for s in snapshots for g in s.gpus if not g.up]
    s, g = down[-1]
    (lost,) = [x for x in json.loads(as_json(s, []))["gpus"] if x["gpu"] == g.index]
    assert lost["up"] is False and lost["gpu_up"] == 0 and lost["uuid"] == (g.uuid or None)
    assert lost["gpu_xid_errors_total"] == {str(x): n for x, n in g.xid_errors_total.items()}
    assert lost["gpu_xid_errors_total"], "the simulated lost GPU reports an XID before it falls off"


def test_a_holder_label_empty_on_one_series_is_null_not_missing(snapshots: list[NodeSnapshot]) -> None:
    """The same jq path works on a process with a job and on one without."""
    opts = OPTIONS["holders"]
    procs = [p for s in snapshots[:1] for g in json.loads(as_json(s, [], opts))["gpus"]
             for p in g.get("gpu_process_memory_used_bytes", [])]  # fmt: skip
    assert procs and {frozenset(p) for p in procs} == {frozenset({"hpc_job", "container_name", "pid", "process",
                                                                  "user", "value"})}  # fmt: skip


def test_collectors_switched_off_leave_their_metrics_out(snapshots: list[NodeSnapshot]) -> None:
    opts = OPTIONS["capped, collectors off"]
    keys = {k for s in snapshots for g in json.loads(as_json(s, [], opts))["gpus"] for k in g}
    assert "gpu_utilization_ratio" in keys
    assert not {k for k in keys if k.startswith("gpu_nvlink_") or k.startswith("gpu_clock")}
    procs = [g["gpu_process_memory_used_bytes"] for s in snapshots
             for g in json.loads(as_json(s, [], opts))["gpus"] if "gpu_process_memory_used_bytes" in g]  # fmt: skip
    assert procs and all(len(p) == 1 for p in procs)  # the cap of one process per GPU
