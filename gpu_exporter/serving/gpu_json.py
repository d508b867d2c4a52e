"""Snapshot -> the ``gpus`` of the ``--once`` JSON, one object per GPU keyed by metric name.

Built from the same series as /metrics (:func:`~gpu_exporter.serving.metrics.gpu_series`), so a
script and a dashboard read the same values under the same names; but each metric's JSON shape
follows from its declaration alone, never from which labels a series happens to carry, so a
script's ``jq`` path holds on every node:

- a per-GPU metric without labels of its own is a number;
- a per-GPU metric with one label of its own is an object from that label's values to numbers;
- ``gpu_info`` (one series per GPU) is an object of its labels;
- every other metric (processes, MIG devices, holders) is a list of objects, each with every label
  beyond ``gpu`` and ``uuid`` (``null`` where empty: a holder label off on this series) and
  ``value``.

The GPU's own holder labels, on every per-GPU series, are left out of the numbers: each holder is
one entry of ``gpu_holder_info``.  Values of metrics counted in whole units (bytes, counts, states)
are integers; the others are floats.  What the GPU does not have is absent, never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..metric_defs import MetricDef, Scope
from ..snapshot import NodeSnapshot
from .metrics import RenderOptions, gpu_declarations, gpu_series, labels_of

# Label values that are numbers, given to scripts as numbers.
_NUMERIC_LABELS: Final = frozenset({"pid", "gpu_instance_id", "compute_instance_id"})
_WHOLE_UNITS: Final = frozenset({"", "bytes"})
_GPU_KEYS: Final = 2  # gpu and uuid lead every series; the GPU's object has them already

Put = Callable[[dict[str, Any], list[str], float], None]


def _label(name: str, value: str) -> Any:
    if not value:
        return None
    return int(value) if name in _NUMERIC_LABELS and value.isdigit() else value


def _shape(d: MetricDef, names: tuple[str, ...]) -> Put:
    """How one series of ``d`` goes into its GPU's object, decided by the declaration."""
    whole = d.unit in _WHOLE_UNITS

    def number(v: float) -> float | int:
        return int(v) if whole and v.is_integer() else v

    if d.name == "gpu_info":
        own = len(d.labels)

        def info(row: dict[str, Any], labels: list[str], v: float) -> None:
            row[d.name] = {k: _label(k, x) for k, x in zip(d.labels, labels[-own:], strict=True)}

        return info
    if d.scope == Scope.GPU and not d.holder and not d.pods and len(d.labels) <= 1:
        if not d.labels:

            def plain(row: dict[str, Any], labels: list[str], v: float) -> None:
                row[d.name] = number(v)

            return plain

        def by_label(row: dict[str, Any], labels: list[str], v: float) -> None:
            row.setdefault(d.name, {})[labels[-1]] = number(v)

        return by_label
    keys = names[_GPU_KEYS:]

    def entries(row: dict[str, Any], labels: list[str], v: float) -> None:
        entry = {k: _label(k, x) for k, x in zip(keys, labels[_GPU_KEYS:], strict=True)}
        row.setdefault(d.name, []).append(entry | {"value": number(v)})

    return entries


def gpu_objects(snapshot: NodeSnapshot, opts: RenderOptions | None = None) -> dict[int, dict[str, Any]]:
    """Each GPU's object by index: ``gpu``, ``uuid``, ``up`` (and ``error`` for one that does not
    answer), then its metrics.  A lost GPU has only what /metrics keeps of it (its XIDs)."""
    opts = opts or RenderOptions()
    gpus: dict[int, dict[str, Any]] = {}
    for g in snapshot.gpus:
        gpus[g.index] = {"gpu": g.index, "uuid": g.uuid or None, "up": g.up}
        if not g.up:
            gpus[g.index]["error"] = g.error
    put = {d.name: _shape(d, labels_of(d, opts)) for d in gpu_declarations(opts)}
    for d, labels, value in gpu_series(snapshot, opts):
        put[d.name](gpus[int(labels[0])], labels, value)
    return gpus
