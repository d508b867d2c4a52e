"""Issue 35: the report counts each GPU once.  Two scrape jobs of one exporter, an HA pair of
Prometheus behind one query front, or federation give the store a GPU's series twice; a newcomer saw
"4 GPUs, 8.00 GPU-hours" for an hour of 4 simulated GPUs, and an unpriced node charged at another
node's price.  Here, without a store: ``report.model.build`` given the answers a store gives (as
test_report_model does), the queries' shape (``report.queries``) and the renderers.  The simulator's
UUIDs are test_simulated_nodes.py's; test_report_dedupe_live.py runs the report against real
Prometheus and VictoriaMetrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import promql_parser as pp
import pytest

from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import exact_cost, hours, queries, window_for
from gpu_exporter.report.render import as_html, as_markdown, as_table
from tests import assert_mentions
from tests.test_report_queries import walk_own

END = 1_796_000_400.0
W = window_for(END - 100 * 3600, END)  # 100 h in 720 steps of 500 s
H100 = "NVIDIA H100 80GB HBM3"
CATALOGUE = load_catalogue()
POD = {"namespace": "ml", "pod": "train"}


def empty() -> dict[str, Any]:
    return {k: [] for k in ("hours", "prices", "seen", "info", "memory_total", "memory_peak", "activity", "timeline")}


def steps(price: float | Sequence[float | None]) -> list[tuple[float, float]]:
    each = [price] * W.points if isinstance(price, float) else list(price)
    return [(W.start + (k + 1) * W.step, v) for k, v in enumerate(each) if v is not None]


def seen_by(r: dict[str, Any], gpu: dict[str, str], *targets: dict[str, str]) -> None:
    """What one GPU's series look like through each target: a copy of every answer per target."""
    for target in targets:
        key = {**gpu, **target}
        r["seen"].append((key, float(W.points)))
        r["info"].append(({**key, "name": H100, "mig_mode": "disabled"}, 1.0))
        r["memory_total"].append((key, 80.0 * 2**30))


JOB_A = {"job": "a", "instance": "n1:9445"}
JOB_B = {"job": "b", "instance": "n1:9445"}


def test_a_gpu_seen_through_two_targets_is_one_gpu_with_the_hours_of_the_range() -> None:
    """Answers that still carry one copy per target (a store that answers per target): one GPU of 100 h
    at 3.00, not two copies adding up to 200 h; its holder holds it 100 h and pays 300."""
    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-a"}
    seen_by(r, gpu, JOB_A, JOB_B)
    for target in (JOB_A, JOB_B):
        r["hours"].append(({**gpu, **target, **POD, "state": "busy"}, 100.0))
        r["prices"].append(({**gpu, **target, "currency": "USD"}, steps(3.0)))
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["gpu_hours"], g["busy_hours"], g["cost"], g["price_per_hour"]) == (100.0, 100.0, 300.0, 3.0)
    assert (doc["totals"]["gpus"], doc["totals"]["gpu_hours"], doc["totals"]["cost"]) == (1, 100.0, 300.0)
    (holder,) = doc["holders"]
    assert (holder["gpus"], holder["gpu_hours"], holder["cost"]) == (1, 100.0, 300.0)


def test_the_report_names_the_targets_it_counted_once() -> None:
    """Each GPU lists the targets that saw it (every label the scrapers attach); the GPUs seen through
    several are counted in the totals and named in every format by node, with each target's job and
    instance and any label its targets differ in (a replica's), but not one they share (a cluster's)."""
    from gpu_exporter.report.render import counted_once

    r = empty()
    replica = {"job": "gpu", "instance": "n2:9445", "cluster": "eu"}
    for i in ("0", "1"):
        gpu = {"node": "n1", "gpu": i, "uuid": f"GPU-1{i}"}
        seen_by(r, gpu, JOB_A, JOB_B)
        r["hours"].append(({**gpu, "state": "idle"}, 100.0))
    seen_by(r, {"node": "n2", "gpu": "0", "uuid": "GPU-20"}, {**replica, "replica": "r1"}, {**replica, "replica": "r2"})
    r["hours"].append(({"node": "n2", "gpu": "0", "uuid": "GPU-20", "state": "idle"}, 100.0))
    seen_by(r, {"node": "n3", "gpu": "0", "uuid": "GPU-30"}, {"job": "gpu", "instance": "n3:9445"})
    r["hours"].append(({"node": "n3", "gpu": "0", "uuid": "GPU-30", "state": "idle"}, 100.0))
    doc = build(W, r, CATALOGUE)
    gpus = {(g["node"], g["gpu"]): g for g in doc["gpus"]}
    assert gpus[("n1", "0")]["targets"] == [JOB_A, JOB_B]
    assert gpus[("n2", "0")]["targets"] == [{**replica, "replica": "r1"}, {**replica, "replica": "r2"}]
    assert gpus[("n3", "0")]["targets"] == [{"job": "gpu", "instance": "n3:9445"}]
    assert (doc["totals"]["gpus"], doc["totals"]["merged_gpus"], doc["totals"]["gpu_hours"]) == (4, 3, 400.0)
    lines = [
        'Counted once: GPUs 0, 1 on n1, each seen through 2 targets: {instance="n1:9445", job="a"}, '
        '{instance="n1:9445", job="b"}',
        'Counted once: GPU 0 on n2, seen through 2 targets: {instance="n2:9445", job="gpu", replica="r1"}, '
        '{instance="n2:9445", job="gpu", replica="r2"}',
    ]
    assert counted_once(doc) == lines
    table, markdown, html = as_table(doc), as_markdown(doc), as_html(doc)
    for line in lines:
        assert f"\n{line}\n" in table and f"\n- {line}\n" in markdown
        assert f"<p>{line.replace(chr(34), '&quot;')}</p>" in html
    assert "n3" not in "".join(counted_once(doc))


def test_many_groups_of_targets_end_in_a_count() -> None:
    """Past five groups of GPUs seen twice (a fleet of nodes, each with its two targets), the headline
    counts the rest and leaves their names to the JSON."""
    from gpu_exporter.report.render import counted_once

    r = empty()
    for n in range(7):
        gpu = {"node": f"n{n}", "gpu": "0", "uuid": f"GPU-{n}"}
        seen_by(r, gpu, {"job": "a", "instance": f"n{n}:9445"}, {"job": "b", "instance": f"n{n}:9445"})
        r["hours"].append(({**gpu, "state": "idle"}, 100.0))
    lines = counted_once(build(W, r, CATALOGUE))
    assert len(lines) == 6
    assert_mentions(lines[4], "GPU 0 on n4", "2 targets")
    assert_mentions(lines[5], "2 more GPUs", "several targets", "the JSON's targets")  # where the rest are named


def test_target_names_from_the_store_are_text_in_every_format() -> None:
    """A job named by a tenant (``<script>``, a Markdown link, a terminal escape) is shown as written."""
    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-0"}
    seen_by(r, gpu, {"job": "<script>x</script>", "instance": "[a](http://e)"}, {"job": "b\x1b[31m", "instance": "i"})
    r["hours"].append(({**gpu, "state": "idle"}, 100.0))
    doc = build(W, r, CATALOGUE)
    assert "<script>" not in as_html(doc) and "&lt;script&gt;x&lt;/script&gt;" in as_html(doc)
    assert r"\<script\>x\</script\>" in as_markdown(doc) and r"\[a\](http://e)" in as_markdown(doc)
    assert "\x1b" not in as_table(doc) and 'job="b\ufffd[31m"' in as_table(doc)


def test_a_gpus_hours_never_exceed_the_range() -> None:
    """Series that still add up to more than the range (one exporter scraped under two names by one job,
    which no label tells apart): 250 h busy and 50 h idle in 100 h are counted as 83.3 and 16.7, their
    cost with them, and a note says so; a few seconds over (the engines' extrapolation at a step's
    edges) are cut silently."""
    r = empty()
    twice = {"node": "n1", "gpu": "0", "uuid": "GPU-twice"}
    seen_by(r, twice, JOB_A)
    r["hours"] += [({**twice, **POD, "state": "busy"}, 250.0), ({**twice, "state": "idle"}, 50.0)]
    r["prices"].append(({**twice, **JOB_A, "currency": "USD"}, steps(3.0)))
    edge = {"node": "n1", "gpu": "1", "uuid": "GPU-edge"}
    seen_by(r, edge, JOB_A)
    r["hours"].append(({**edge, "state": "busy"}, 100.0 + W.step / 3600))
    doc = build(W, r, CATALOGUE)
    g, e = doc["gpus"]
    assert (g["gpu_hours"], g["busy_hours"], g["idle_hours"]) == (100.0, 83.333333, 16.666667)
    assert (g["cost"], g["wasted_cost"], g["price_per_hour"]) == (300.0, 50.0, 3.0)
    assert_mentions(g["notes"][0], "300 h", "100 h range", "scraped twice", "two addresses in one job",
                    "scaled down")  # fmt: skip
    # No note of hours over the range (issue 48's note of why it is not sized, unpriced, aside).
    assert e["gpu_hours"] == 100.0 and not [n for n in e["notes"] if not n.startswith("not sized:")], e["notes"]
    (holder,) = doc["holders"]
    assert (holder["gpu_hours"], holder["cost"]) == (83.333333, 250.0)
    assert doc["totals"]["gpu_hours"] == 200.0


@pytest.mark.parametrize("changes", [False, True], ids=["one-price", "price-changed"])
def test_a_price_never_crosses_from_one_node_to_another(changes: bool) -> None:
    """Nodes n1 and n2 report one uuid (two simulators of an older gpu-exporter, seeded alike): two
    GPUs, n1's at its price (3.00, or 3.00 then 4.00 half-way), n2's unpriced, never at n1's."""
    r = empty()
    priced, unpriced = {"node": "n1", "gpu": "0", "uuid": "GPU-same"}, {"node": "n2", "gpu": "0", "uuid": "GPU-same"}
    seen_by(r, priced, JOB_A)
    seen_by(r, unpriced, {"job": "a", "instance": "n2:9445"})
    half = W.points // 2
    price: float | list[float] = [3.0] * half + [4.0] * half if changes else 3.0
    r["prices"].append(({**priced, **JOB_A, "currency": "USD"}, steps(price)))
    whole = [({**g, "state": "busy"}, 100.0) for g in (priced, unpriced)]
    if changes:  # the hours come in the pieces the price cut the range into
        r[f"hours:1:{half}"] = [({**g, "state": "busy"}, 50.0) for g in (priced, unpriced)]
        r[f"hours:{half + 1}:{W.points}"] = [({**g, "state": "busy"}, 50.0) for g in (priced, unpriced)]
    else:
        r["hours"] = whole
    doc = build(W, r, CATALOGUE)
    gpus = {g["node"]: g for g in doc["gpus"]}
    assert (gpus["n1"]["gpu_hours"], gpus["n1"]["cost"]) == (100.0, 350.0 if changes else 300.0)
    assert (gpus["n2"]["gpu_hours"], gpus["n2"]["cost"], gpus["n2"]["price_now_per_hour"]) == (100.0, None, None)
    t = doc["totals"]
    assert (t["gpus"], t["unpriced_gpus"], t["unpriced_hours"], t["cost"]) == (2, 1, 100.0, 350.0 if changes else 300.0)


def test_a_gpu_with_a_uuid_and_no_node_label_is_named_by_the_first_target_that_saw_it() -> None:
    """Scraped without a node label, by two targets: its hours come without an instance (queries.once
    adds the instances up), and its node is named by the first of its targets' addresses."""
    r = empty()
    gpu = {"gpu": "0", "uuid": "GPU-0"}
    r["hours"].append(({**gpu, "state": "idle"}, 100.0))
    seen_by(r, gpu, {"job": "a", "instance": "b.example:9445"}, {"job": "a", "instance": "a.example:9445"})
    (g,) = build(W, r, CATALOGUE)["gpus"]
    assert (g["node"], g["gpu_hours"]) == ("a.example:9445", 100.0)
    # An older exporter (no "down" series, so no targets): named by the address its other series carry.
    r = empty()
    r["hours"].append(({**gpu, "instance": "c.example:9445", "state": "idle"}, 100.0))
    # Another GPU, no node label nor address nor index anywhere, its model alone known (no hours): no node,
    # no index, no note.
    r["info"].append(({"uuid": "GPU-1", "name": H100}, 1.0))
    other, g = build(W, r, CATALOGUE)["gpus"]  # by node: "" first
    assert (g["node"], g["targets"]) == ("c.example:9445", [])
    assert (other["node"], other["gpu"], other["gpu_hours"], other["notes"]) == ("", "", 0.0, [])


def test_each_targets_figures_give_the_highest_whatever_their_order() -> None:
    """Memory sizes and peaks and the activity's p95, from two targets' copies: the highest, whichever
    the store lists first (a peak one scraper missed is still the GPU's)."""
    for first, second in ((JOB_A, JOB_B), (JOB_B, JOB_A)):
        r = empty()
        gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-0"}
        seen_by(r, gpu, first, second)
        r["hours"].append(({**gpu, **POD, "state": "busy"}, 100.0))
        r["memory_peak"] = [({**gpu, **first}, 12.0 * 2**30), ({**gpu, **second}, 10.0 * 2**30)]
        r["memory_total"] = [({**gpu, **first}, 80.0 * 2**30), ({**gpu, **second}, 79.0 * 2**30)]
        r["activity"] = [({**gpu, **first, "signal": "sm_active"}, 0.4), ({**gpu, **second, "signal": "sm_active"},
                                                                          0.3)]  # fmt: skip
        if first is JOB_B:
            for k in ("memory_peak", "memory_total", "activity"):
                r[k].reverse()
        (g,) = build(W, r, CATALOGUE)["gpus"]
        assert (g["memory_peak_bytes"], g["memory_total_bytes"], g["activity_p95"]) == (12 * 2**30, 80 * 2**30, 0.4)


def test_the_price_and_the_steps_seen_of_a_gpu_are_the_highest_of_its_targets() -> None:
    """Each target's copy of a GPU's price at a step, and of the steps it saw the GPU: the highest,
    whichever comes last.  A target that saw the GPU on fewer steps than another says nothing of the
    steps it missed: 500 priced steps of the 720 the other target saw make the GPU priced step by step."""
    from gpu_exporter.report.cost import plan

    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-0"}
    r = empty()
    r["prices"] = [({**gpu, **JOB_B, "currency": "USD"}, steps(4.0)), ({**gpu, **JOB_A, "currency": "USD"}, steps(3.0))]
    r["seen"] = [({**gpu, **JOB_A}, float(W.points)), ({**gpu, **JOB_B}, float(W.points))]
    assert plan(W, r, "USD").steady == {("n1", "GPU-0", ""): 4.0}
    r["prices"] = [({**gpu, **JOB_A, "currency": "USD"}, steps([3.0] * 500 + [None] * (W.points - 500)))]
    r["seen"] = [({**gpu, **JOB_A}, float(W.points)), ({**gpu, **JOB_B}, 400.0)]
    p = plan(W, r, "USD")
    assert (p.exact, p.steady) == ({("n1", "GPU-0", ""): "GPU-0"}, {})


# -- the queries: each step's increase once, however many copies ---------------------------------------------
def aggregations(expr: str) -> list[tuple[str, bool, set[str]]]:
    """Every aggregation of a query: (operator, ``without``, its labels); but those of the reading each
    step counts from, matched to each series by ``group_left`` (``queries.counted_until``), whose
    labels the step's figure does not take."""
    out = []
    for node in walk_own(pp.parse(expr)):
        if isinstance(node, pp.AggregateExpr):
            modifier = node.modifier
            without = modifier is not None and str(modifier.type).endswith("Without")
            out.append((str(node.op), without, set(modifier.labels) if modifier is not None else set()))
    return out


def test_every_label_a_holder_can_have_tells_copies_apart() -> None:
    """Two series of one GPU and state that agree on every label of a holder are copies of one counter:
    the list is the exporter's own (snapshot.HOLDER_LABELS, every kind), so a pod's containers or two
    Slurm jobs of one user are never taken for copies and merged."""
    from gpu_exporter.report.queries import EVERY_HOLDER_LABEL as EVERY
    from gpu_exporter.report.queries import EXPORTED
    from gpu_exporter.snapshot import HOLDER_LABELS

    assert set(EVERY) == {label for labels in HOLDER_LABELS.values() for label in labels}
    # and a MIG card's GPU instances (each slice's books): two idle slices nobody holds are not copies.
    assert ", ".join((*EVERY, "gpu_instance_id", "state")) == EXPORTED


def test_the_hours_take_each_steps_largest_copy_never_the_sum_of_copies() -> None:
    """Where some GPU was seen through two scrapers, in the hours, the timeline and the step-by-step
    cost, each step's increase is the largest of the copies (``max`` by the GPU, its node and every
    label the exporter writes, so by no label a scraper attaches), after adding up, within one scraper,
    the instances an exporter moved between; a GPU without a uuid keeps its instance.  Where none was,
    the increases are as they are: the store does not aggregate at every step for nothing."""
    from gpu_exporter.report.queries import EXPORTED, timeline

    w = window_for(END - 7 * 86400, END, 15)
    exported = set(EXPORTED.split(", "))
    for plain in (hours(w, "").expr, timeline(w, "").expr, exact_cost(w, "", ["GPU-1"], "USD").expr):
        # (but the larger of two figures of each series in a step's increase, queries.counted)
        found = [a for a in aggregations(plain) if a[2] != {"counted_as"}]
        assert not any(without for _, without, _ in found) and all(op == "sum" for op, _, labels in found
                                                                   if "state" in labels), plain  # fmt: skip
    for expr in (hours(w, "", copies=True).expr, timeline(w, "", copies=True).expr,
                 exact_cost(w, "", ["GPU-1"], "USD", copies=True).expr):  # fmt: skip
        found = [a for a in aggregations(expr) if a[2] != {"counted_as"}]
        maxes = [labels for op, without, labels in found if op == "max" and not without and "state" in labels]
        assert len(maxes) == 2, (found, expr)
        with_uuid, without_uuid = maxes
        assert with_uuid - {"currency"} == exported | {"node", "gpu", "uuid"}, expr
        assert without_uuid - {"currency"} == exported | {"node", "instance", "gpu"}, expr
        sums = [labels for op, without, labels in found if op == "sum" and without and labels == {"instance"}]
        # sum without (instance): the exporter that moved; once for the exporter's own job's series, once
        # for other jobs' (counted only where the own job did not see the GPU: queries.foreign)
        assert len(sums) == 2, expr
        assert "job" not in with_uuid | without_uuid


@pytest.mark.parametrize(
    ("targets", "twice"),
    [
        ([JOB_A], False),
        ([JOB_A, JOB_B], True),  # two scrape jobs
        ([{**JOB_A, "replica": "r1"}, {**JOB_A, "replica": "r2"}], True),  # an HA pair
        ([JOB_A, {"job": "a", "instance": "10.0.0.7:9445"}], False),  # one job's exporter that moved
    ],
    ids=["one-target", "two-jobs", "two-replicas", "moved"],
)
def test_the_hours_are_counted_once_where_some_gpu_was_seen_by_two_scrapers(targets: list[dict[str, str]],
                                                                             twice: bool) -> None:  # fmt: skip
    """Two targets of one GPU that differ in more than their instance are two scrapers; an exporter one
    job saw at two addresses is one scraper's, whose hours add up as they are."""
    from gpu_exporter.report.cost import seen_twice

    r = empty()
    seen_by(r, {"node": "n1", "gpu": "1", "uuid": "GPU-1"}, JOB_A)  # another GPU, one target
    seen_by(r, {"node": "n1", "gpu": "0", "uuid": "GPU-0"}, *targets)
    assert seen_twice(r) is twice
    # Without a uuid, a GPU is its index on its target: two targets are two GPUs, never copies.
    r = empty()
    seen_by(r, {"gpu": "0"}, *targets)
    assert seen_twice(r) is (twice and len({t["instance"] for t in targets}) == 1)


def test_the_gpus_seen_are_asked_per_target() -> None:
    """The "seen" query keeps every label but the exporter's (job, instance, a replica label): the
    targets that saw each GPU, which the report names."""
    from gpu_exporter.report.queries import EXPORTED

    seen = {q.key: q.expr for q in queries(window_for(END - 86400, END, 15), "")}["seen"]
    assert seen.startswith(f"max without ({EXPORTED}) (count_over_time(")


# -- copies that disagree (issue 48 item 4) -----------------------------------------------------------------
OWN_TARGET = {"job": "gpu-exporter", "instance": "n1:9445"}
FORGER = {"job": "kubernetes-pods", "instance": "10.1.2.3:8080"}


def test_the_targets_whose_copies_disagree_with_the_own_job_are_named() -> None:
    """The store left out another job's copies that gave the GPU holders the exporter's own job did not
    report (``queries.disagreeing`` says how many hours, per target): the GPU keeps the own job's hours
    and cost, and every format names both targets.  A target's few seconds at a holder's first step (less
    than a step) are not named."""
    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-a"}
    seen_by(r, gpu, OWN_TARGET, FORGER)
    r["hours"].append(({**gpu, **POD, "state": "busy"}, 100.0))
    r["prices"].append(({**gpu, **OWN_TARGET, "currency": "USD"}, steps(3.0)))
    r["disagree"] = [({**gpu, **FORGER}, 100.0), ({**gpu, "job": "federate", "instance": "n1:9445"}, W.step / 3600)]
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["gpu_hours"], g["cost"], g["holder"]) == (100.0, 300.0, "pod ml/train")
    assert g["left_out_targets"] == [{**FORGER, "hours": 100.0}]
    assert g["targets"] == [OWN_TARGET] and doc["totals"]["merged_gpus"] == 0  # the forger's is no copy of it
    (note,) = [n for n in g["notes"] if not n.startswith("not sized")]  # the advice may say why it has none
    assert_mentions(note, '{instance="10.1.2.3:8080", job="kubernetes-pods"} (100 h)', "disagree",
                    'the exporter\'s own job, {instance="n1:9445", job="gpu-exporter"}', "left out")  # fmt: skip
    assert "federate" not in note and "scraped twice" not in note
    table, markdown, html = as_table(doc), as_markdown(doc), as_html(doc)
    assert 'job="kubernetes-pods"' in table and r'job="kubernetes-pods"' in markdown
    assert "job=&quot;kubernetes-pods&quot;" in html and "job=&quot;gpu-exporter&quot;" in html


def test_targets_that_disagree_with_no_own_job_among_them_are_named_not_one_exporter_twice() -> None:
    """Two jobs, neither the exporter's own, whose copies add up to 200 h in 100 h: the report cannot
    tell which is right, scales the hours down as before, and says that these targets disagree (not
    that one exporter was scraped twice under names no label tells apart)."""
    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-a"}
    seen_by(r, gpu, JOB_A)
    r["other_jobs"] = [({**gpu, **JOB_B}, float(W.points))]  # a copy without the "down" series
    r["hours"] += [({**gpu, **POD, "state": "busy"}, 100.0), ({**gpu, "namespace": "x", "pod": "y", "state": "busy"},
                                                                100.0)]  # fmt: skip
    (g,) = build(W, r, CATALOGUE)["gpus"]
    assert g["gpu_hours"] == 100.0
    (note,) = [n for n in g["notes"] if not n.startswith("not sized")]  # the advice may say why it has none
    assert_mentions(note, "200 h", '{instance="n1:9445", job="a"}, {instance="n1:9445", job="b"} disagree',
                    'job=~".*gpu-exporter.*"', "--selector")  # fmt: skip
    assert "scraped twice" not in note


def test_another_jobs_copy_without_the_down_series_turns_on_counting_once() -> None:
    """A forged copy need not write the "down" series that "seen" reads: the other jobs' state series
    (``other_jobs``) count as a scraper of the GPU too."""
    from gpu_exporter.report.cost import seen_twice

    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-0"}
    seen_by(r, gpu, OWN_TARGET)
    assert not seen_twice(r)
    r["other_jobs"] = [({**gpu, **FORGER}, float(W.points))]
    assert seen_twice(r)


def test_other_jobs_are_read_apart_from_the_exporters_own() -> None:
    """``other_jobs`` reads only other jobs' state series (a store that scrapes only the own job reads
    nothing); ``disagreeing`` sums, per GPU and target, the other jobs' increases of series the own job
    had no sample of at a step it saw the GPU, raw and recorded."""
    from gpu_exporter.report.queries import OWN_JOB, disagreeing, other_jobs, recorded_window

    w = window_for(END - 7 * 86400, END, 15)
    recorded = recorded_window(END - 7 * 86400, END)
    assert recorded is not None
    for q in (other_jobs(w, ""), other_jobs(recorded, "", True)):
        pp.parse(q.expr)
        assert q.expr.count(f'job!~"{OWN_JOB}"') == 1 and f'job=~"{OWN_JOB}"' not in q.expr, q.expr
    # Raw, the other jobs' increase is read as the hours are, across a scrape gap (queries.counted: its
    # selector in six places); recorded, the hour's figure once.
    for q, theirs in ((disagreeing(w, ""), 6), (disagreeing(recorded, "", True), 1)):
        pp.parse(q.expr)
        assert q.expr.startswith("sum without (namespace, pod, container, hpc_job, user,"), q.expr
        assert " unless on (node, gpu, uuid, namespace," in q.expr and " and on (node, gpu, uuid) " in q.expr
        assert q.expr.count(f'job!~"{OWN_JOB}"') == theirs and q.expr.count(f'job=~"{OWN_JOB}"') == 2


def test_one_jobs_targets_that_add_up_past_the_range_are_named() -> None:
    """A job that scrapes the exporter and a pod that copies its GPU's labels (one ``kubernetes-pods``
    job for both): one scraper at two addresses whose hours overlap, not an exporter that moved (whose
    addresses follow each other).  The report cannot tell them apart, scales the hours down as before,
    and names both targets."""
    r = empty()
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-a"}
    pods = [
        {"job": "kubernetes-pods", "instance": "10.0.0.1:9445"},
        {"job": "kubernetes-pods", "instance": FORGER["instance"]},
    ]
    r["other_jobs"] = [({**gpu, **t}, float(W.points)) for t in pods]
    r["hours"] += [({**gpu, **POD, "state": "busy"}, 100.0), ({**gpu, "namespace": "x", "pod": "y", "state": "busy"},
                                                                100.0)]  # fmt: skip
    (g,) = build(W, r, CATALOGUE)["gpus"]
    (note,) = [n for n in g["notes"] if not n.startswith("not sized")]  # the advice may say why it has none
    assert_mentions(note, "200 h", '{instance="10.0.0.1:9445", job="kubernetes-pods"}, '
                    '{instance="10.1.2.3:8080", job="kubernetes-pods"} at once', "a job of its own")  # fmt: skip
