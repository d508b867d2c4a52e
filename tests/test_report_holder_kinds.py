"""The report names every kind of holder the exporter writes: a pod, a Slurm job, a container or a
Unix user (docs/holders-processes-mig.md).  Its queries grouped GPU time by ``namespace, pod, user``
only, so a container's time (no ``user`` label) belonged to nobody: no holder row, no cost, nobody
to reclaim an idle GPU from; and two jobs of one user were one holder.

The exporter's own books (the accountant and its exposition, fed the holders test's node) give the
series; the store's answer is the report's own ``sum by`` over them, read from the query; the model
must name each holder as the exporter does (``Holder.name``, which /alerts and ``--once`` show)."""

from __future__ import annotations

from collections import defaultdict
from html import escape as html_escape
from typing import Any

import promql_parser as pp
import pytest

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import exact_cost, hours, queries
from gpu_exporter.report.render import as_html, as_markdown, as_table
from gpu_exporter.snapshot import container_holder, job_holder, user_holder
from tests.test_holders_everywhere import EVIL, IDLE_JOB, JOB, TRAINER, exposition, node, samples
from tests.test_report_model import H100, W, empty, steps

NODE = {"node": "n1", "instance": "n1:9445", "job": "gpu"}


def grouping(expr: str) -> list[str]:
    """The labels of a query's outermost ``sum by`` / ``max by``."""
    e = pp.parse(expr)
    while isinstance(e, pp.BinaryExpr):  # "... / 3600"
        e = e.lhs
    assert isinstance(e, pp.AggregateExpr) and e.modifier is not None, expr
    return list(e.modifier.labels)


def store_answer(by: list[str], series: list[dict[str, Any]]) -> list[tuple[dict[str, str], float]]:
    """What a store answers to ``sum by (by) (...)`` over these series: hours per group."""
    out: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for s in series:
        labels = {**NODE, **{k: v for k, v in s.items() if k != "value"}}
        key = tuple((k, labels[k]) for k in by if labels.get(k))
        out[key] += float(s["value"]) / 3600
    return [(dict(k), v) for k, v in out.items()]


def report() -> dict[str, Any]:
    books = Accountant(threshold=0.1)
    t0 = W.end - 3600
    for i in range(13):  # an hour of polls, five minutes apart
        books.observe(node(t=t0 + i * 300, monotonic=100.0 + i * 300))
    series = [s for s in samples(exposition(node(), books), "gpu_state_seconds_total") if "state" in s]
    r = empty()
    r["hours"] = store_answer(grouping(hours(W, "").expr), series)
    held = grouping(next(q for q in queries(W, "") if q.key == "holders_now").expr)
    r["holders_now"] = [
        (labels, 1.0)
        for labels, v in store_answer([*held, "state"], series)
        if v and labels.get("state") in ("busy", "allocated_idle")
    ]
    for gpu in ("0", "1", "2", "3"):
        key = {**{k: NODE[k] for k in ("node", "instance")}, "gpu": gpu, "uuid": f"GPU-{gpu}"}
        r["prices"].append(({**key, "currency": "USD"}, steps(W, 3.0)))
        r["seen"].append((key, 12.0))
        r["info"].append(({**key, "name": H100, "mig_mode": "disabled"}, 1.0))
        r["memory_total"].append((key, 80 * 1024**3))
    return build(W, r, load_catalogue())


def test_every_kind_of_holder_has_its_own_row_named_as_the_exporter_names_it() -> None:
    doc = report()
    by_name = {h["holder"]: h for h in doc["holders"]}
    assert set(by_name) == {
        job_holder(JOB).name,  # "job 4242 of alice"
        job_holder(IDLE_JOB).name,  # "job 4250"
        container_holder(TRAINER).name,  # "container trainer"
        container_holder(EVIL).name,
        user_holder("bob").name,
    }, doc["holders"]
    trainer, evil = by_name[container_holder(TRAINER).name], by_name[container_holder(EVIL).name]
    # The shared GPU's hour split 3:1 by its containers' SM utilization, each paying its share.
    assert (trainer["kind"], trainer["container"], trainer["busy_hours"]) == ("container", "trainer", 0.75)
    assert (evil["busy_hours"], trainer["cost"], evil["cost"]) == (0.25, 2.25, 0.75)
    job = by_name[job_holder(JOB).name]
    assert (job["kind"], job["hpc_job"], job["user"], job["busy_hours"], job["cost"]) == (
        "job",
        "4242",
        "alice",
        1.0,
        3.0,
    )
    idle = by_name[job_holder(IDLE_JOB).name]
    assert (idle["allocated_idle_hours"], idle["wasted_cost"]) == (1.0, 3.0)
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    assert gpus["1"]["holder"] == container_holder(TRAINER).name
    assert gpus["3"]["holder"] == job_holder(IDLE_JOB).name


def test_an_idle_gpu_held_by_a_job_is_reclaimed_from_that_job() -> None:
    """GPU 3: allocated to job 4250 all hour, nothing running: the job holds it now and wasted it."""
    doc = report()
    (rec,) = [r for r in doc["recommendations"] if r["gpu"] == "3"]
    assert (rec["kind"], rec["holder"]) == ("reclaim", job_holder(IDLE_JOB).name), rec
    assert job_holder(IDLE_JOB).name in rec["reason"]


@pytest.mark.parametrize("kind", ["hours", "exact_cost", "holders_now"])
def test_every_query_that_names_holders_groups_by_every_holders_identity(kind: str) -> None:
    expr = {
        "hours": lambda: hours(W, "").expr,
        "exact_cost": lambda: exact_cost(W, "", ["GPU-0"], "USD").expr,
        "holders_now": lambda: next(q for q in queries(W, "") if q.key == "holders_now").expr,
    }[kind]()
    assert {"namespace", "pod", "hpc_job", "container_id", "container_name", "user"} <= set(grouping(expr)), expr


def test_a_hostile_container_name_is_plain_text_in_every_format() -> None:
    """A container's name comes from an engine's API, which a tenant controls: the holders test's name
    holds a label breaker, a line break, a terminal escape and a script tag.  The table shows it with
    replacement characters, the HTML escapes it, and the Markdown escapes what Markdown would read as
    markup (a script tag is HTML to a Markdown renderer, brackets a link, stars emphasis)."""
    doc = report()
    name = container_holder(EVIL).name
    shown = "".join(c if c.isprintable() else "\ufffd" for c in name)
    table, html, md = as_table(doc), as_html(doc), as_markdown(doc)
    assert shown in table and "\x1b" not in table
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<script>" not in md and "\x1b" not in md
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (mutmut's textual brings it)")
    page = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page, page
    # Every holder reads in the rendered page as the table shows it.
    for h in doc["holders"]:
        text = "".join(c if c.isprintable() else "\ufffd" for c in h["holder"])
        assert html_escape(text) in page, text
