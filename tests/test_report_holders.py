"""A holder's identity in the report is what tells holders apart on /metrics (issue 48 item 4, issue
50 item 6a).  A container found in a user's delegated cgroup is ``container_engine="docker@1000"``
on /metrics (holders/cgroups.py) and never shares a holder with the system engine's container of
the same ID there; the report dropped ``container_engine``, so the two were one holder and the
victim's container was billed for the forger's.  Here, without a store: ``report.holders``, the
queries' grouping and ``report.model.build`` given the answers a store gives."""

from __future__ import annotations

import promql_parser as pp

from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.holders import holder_of
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import exact_cost, hours, queries, timeline
from gpu_exporter.snapshot import ContainerRef, container_holder
from tests.test_report_model import W, empty, steps

CID = "fedcba987654" + "1" * 52
SYSTEM = container_holder(ContainerRef("docker", CID, ""))  # the system engine's, unnamed: its short ID
ROOTLESS = container_holder(ContainerRef("docker@1000", CID, ""))  # user 1000's, same ID
GPU = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}


def test_a_rootless_container_and_the_system_engines_of_one_id_are_two_holders() -> None:
    """The exporter writes them as two holders (two label sets); the report reads them back as two,
    each with its engine, where the name alone (the same short ID) would make them one."""
    system, rootless = holder_of(SYSTEM.labels()), holder_of(ROOTLESS.labels())
    assert system != rootless
    assert (system.engine, rootless.engine) == ("docker", "docker@1000")
    assert system.name == rootless.name == SYSTEM.name  # the words are the exporter's own


def _grouping(expr: str) -> set[str]:
    e = pp.parse(expr)
    while isinstance(e, pp.BinaryExpr):  # "... / 3600"
        e = e.lhs
    assert isinstance(e, pp.AggregateExpr) and e.modifier is not None, expr
    return set(e.modifier.labels)


def test_every_query_that_groups_by_holder_keeps_the_engine() -> None:
    """Hours, step-by-step cost and who holds a GPU now are grouped by the engine too: a store asked
    without it adds the two containers' hours into one row, and no model can split them again."""
    now = next(q for q in queries(W, "") if q.key == "holders_now").expr
    for expr in (hours(W, "").expr, hours(W, "", copies=True).expr, exact_cost(W, "", ["GPU-0"], "USD").expr, now):
        assert {"container_engine", "container_id", "container_name"} <= _grouping(expr), expr
    assert _grouping(timeline(W, "").expr) == {"state"}  # the timeline has no holders


def test_each_container_keeps_its_own_hours_and_cost() -> None:
    """60 h busy for the system engine's container and 40 h allocated but idle for user 1000's, of
    one ID on one GPU at 2.00 an hour: two holder rows, each with its hours, cost and engine, told
    apart in words by their engines (their names alone are the same short ID)."""
    r = empty()
    r["hours"] = [({**GPU, **SYSTEM.labels(), "state": "busy"}, 60.0),
                  ({**GPU, **ROOTLESS.labels(), "state": "allocated_idle"}, 40.0)]  # fmt: skip
    r["prices"] = [({**GPU, "currency": "USD"}, steps(W, 2.0))]
    doc = build(W, r, load_catalogue())
    rows = {h["container_engine"]: h for h in doc["holders"]}
    assert set(rows) == {"docker", "docker@1000"}
    system, rootless = rows["docker"], rows["docker@1000"]
    assert (system["busy_hours"], system["allocated_idle_hours"], system["cost"]) == (60.0, 0.0, 120.0)
    assert (rootless["busy_hours"], rootless["allocated_idle_hours"], rootless["cost"]) == (0.0, 40.0, 80.0)
    assert (rootless["wasted_cost"], system["wasted_cost"]) == (80.0, 0.0)
    short = CID[:12]
    assert (system["holder"], rootless["holder"]) == (f"container {short} (docker)", f"container {short} (docker@1000)")
    assert system["container"] == rootless["container"] == short


def test_a_name_no_other_holder_has_is_shown_as_the_exporter_writes_it() -> None:
    r = empty()
    r["hours"] = [({**GPU, **ROOTLESS.labels(), "state": "busy"}, 10.0)]
    (row,) = build(W, r, load_catalogue())["holders"]
    assert (row["holder"], row["container_engine"]) == (ROOTLESS.name, "docker@1000")


def test_the_charges_keep_the_two_containers_apart_with_their_engines() -> None:
    """CSV and FOCUS rows carry the engine too: without it, the two containers' rows read the same."""
    import csv
    import io
    import json

    from gpu_exporter.report.cost import Part
    from gpu_exporter.report.csv_export import as_csv
    from gpu_exporter.report.focus import as_focus

    r = empty()
    r["hours"] = [({**GPU, **SYSTEM.labels(), "state": "busy"}, 60.0),
                  ({**GPU, **ROOTLESS.labels(), "state": "allocated_idle"}, 40.0)]  # fmt: skip
    r["prices"] = [({**GPU, "currency": "USD"}, steps(W, 2.0))]
    doc = build(W, r, load_catalogue())
    rows = [x for x in csv.DictReader(io.StringIO(as_csv([Part(W, r)], doc))) if x["holder_kind"] == "container"]
    assert {(x["container_engine"], x["state"], x["hours"], x["cost"]) for x in rows} == {
        ("docker", "busy", "60.0", "120.0000"), ("docker@1000", "allocated_idle", "40.0", "80.0000")}  # fmt: skip
    focus = [x for x in csv.DictReader(io.StringIO(as_focus([Part(W, r)], doc))) if x["x_HolderKind"] == "container"]
    assert {json.loads(x["Tags"])["container_engine"] for x in focus} == {"docker", "docker@1000"}
