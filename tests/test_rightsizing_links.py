"""Issue 48, items 5 and 6: a GPU starved by its PCIe link is told to fix the link, with the figures,
before any card; a card with no NVLink links is sized as one that moves nothing over NVLink; and a GPU
busy enough to size that gets no advice says why, in every format.

``build`` is given the query results as the client returns them (test_report_model's helpers)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.report.model import Options, build
from gpu_exporter.report.render import as_html, as_markdown, as_table
from tests.test_report_model import CATALOGUE, GIB, W, add_gpu, empty

H100_PCIE = "NVIDIA H100 PCIe"
KEY = {"node": "n1", "instance": "n1:9445", "gpu": "1", "uuid": "GPU-1"}
JOB = {"hpc_job": "7", "user": "alice"}
OPTS = Options(pricing=PricingSettings(currency="USD", models={"H100": 2.5, "L40S": 1.0, "L4": 0.5}))


def plain_h100(r: dict[str, Any], *, links: int | None, sm: float = 0.20) -> None:
    """An H100 PCIe held all range long: ``sm`` SM activity at its bursts, 10% DRAM bandwidth, 30 GiB,
    no pipe busy, and no NVLink traffic series (a card without links has none)."""
    add_gpu(r, KEY, H100_PCIE, {"busy": W.hours}, price=2.5, holder=JOB, peak=30 * GIB)
    for signal, v in (("sm_active", sm), ("dram_active", 0.10), ("tensor_active", sm), ("fp64_active", 0.0),
                      ("fp32_active", 0.0), ("fp16_active", 0.0)):  # fmt: skip
        r["activity"].append(({**KEY, "signal": signal}, v))
    if links is not None:
        r.setdefault("links", []).append(({**KEY, "what": "nvlink_links"}, float(links)))


def test_a_card_with_no_nvlink_links_is_sized_as_moving_nothing_over_nvlink() -> None:
    """Its NVLink counters are absent because it has no links: known, so an L40S (no NVLink) fits it."""
    r = empty()
    plain_h100(r, links=0)
    doc = build(W, r, CATALOGUE, OPTS)
    (rec,) = doc["recommendations"]
    assert (rec["kind"], rec["suggested"]) == ("card", "L40S")
    assert rec["saving_per_month"] == pytest.approx((2.5 - 1.0) * 730)
    assert "NVLink traffic is unknown" not in rec["reason"]
    assert not [n for g in doc["gpus"] for n in g["notes"]]


def test_a_card_whose_links_are_unknown_gets_no_card_and_a_note_that_says_why() -> None:
    """Without gpu_nvlink_links the traffic is unknown: no card without NVLink, and a note says so, in
    the table, the Markdown, the HTML and the JSON."""
    r = empty()
    plain_h100(r, links=None)
    doc = build(W, r, CATALOGUE, OPTS)
    assert doc["recommendations"] == []
    (note,) = doc["gpus"][0]["notes"]
    assert note.startswith("no cheaper card fits: of the ")
    assert "without NVLink as fast as an H100 PCIe's, which its unknown NVLink traffic may need" in note
    assert "no gpu_nvlink_links to say it has none" in note
    for text in (as_table(doc), as_markdown(doc), as_html(doc)):
        assert "no cheaper card fits" in text and "unknown NVLink traffic" in text


def test_a_busy_gpu_with_no_cheaper_card_that_keeps_up_says_so() -> None:
    r = empty()
    plain_h100(r, links=0, sm=0.9)
    doc = build(W, r, CATALOGUE, OPTS)
    assert doc["recommendations"] == []
    (note,) = doc["gpus"][0]["notes"]
    assert note.startswith("no cheaper card fits") and "slower at its bursts" in note


def test_a_gpu_in_no_catalogue_or_without_a_price_says_why_it_is_not_sized() -> None:
    r = empty()
    # Two GPUs of one job of different models are sized together or not at all, and say so.
    add_gpu(r, {**KEY, "gpu": "3", "uuid": "GPU-3"}, H100_PCIE, {"busy": W.hours}, price=2.5, holder=JOB,
            peak=30 * GIB, activity=0.2)  # fmt: skip
    add_gpu(r, KEY, "NVIDIA Quadro Z9", {"busy": W.hours}, price=2.5, holder=JOB, peak=30 * GIB, activity=0.2)
    add_gpu(r, {**KEY, "gpu": "2", "uuid": "GPU-2"}, H100_PCIE, {"busy": W.hours}, holder={**JOB, "hpc_job": "8"},
            peak=30 * GIB, activity=0.2)  # fmt: skip
    add_gpu(r, {**KEY, "gpu": "4", "uuid": "GPU-4"}, "NVIDIA Quadro Z9", {"busy": W.hours}, price=2.5,
            holder={**JOB, "hpc_job": "9"}, peak=30 * GIB, activity=0.2)  # fmt: skip
    notes = {g["gpu"]: g["notes"] for g in build(W, r, CATALOGUE, OPTS)["gpus"]}
    assert notes["4"] == ["not sized: its model (NVIDIA Quadro Z9) is not in the catalogue, so what it does per "
                          "second is unknown (a catalogue of your own, --catalogue FILE, can add it)"]  # fmt: skip
    assert notes["2"] == ["not sized: it has no price, so no card can be told cheaper (set the exporter's pricing "
                          "section)"]  # fmt: skip
    together = ["not sized: its holder's GPUs are of different models or holders, and are sized together or not at all"]
    assert notes["1"] == notes["3"] == together


def starved(r: dict[str, Any], bound_s: float) -> None:
    """The issue's H100: its link trained at Gen3 x8 where card and slot allow Gen5 x16, RX at 96% of
    it, 33% SM activity."""
    plain_h100(r, links=0, sm=0.33)
    for what, v in (("pcie_gen", 3), ("pcie_max_gen", 5), ("pcie_width", 8), ("pcie_max_width", 16),
                    ("pcie_capacity", 7.88e9)):  # fmt: skip
        r["links"].append(({**KEY, "what": what}, float(v)))
    r["pcie_load"] = [({**KEY, "what": "rx"}, 0.96), ({**KEY, "what": "tx"}, 0.04)]
    r["pcie_bound"] = [(KEY, bound_s)]


def test_a_gpu_starved_by_its_link_is_told_to_fix_the_link_not_to_move() -> None:
    r = empty()
    starved(r, bound_s=80 * 3600)
    doc = build(W, r, CATALOGUE, OPTS)
    (rec,) = doc["recommendations"]
    assert (rec["kind"], rec["suggested"], rec["saving_per_month"], rec["no_saving_figure"]) == (
        "link",
        "fix the PCIe link",
        None,
        "a link to fix",
    )
    reason = rec["reason"]
    for said in ("Gen3 x8 (7.9 GB/s each way)", "Gen5 x16 (63.0 GB/s each way)", "RX 96%",
                 "link-bound (the link 90% full or more) for 80 h of the 100 h it was held, which cost $200",
                 "33% SM activity", "reseat the card", "BIOS", "riser", "slot"):  # fmt: skip
        assert said in reason, said
    assert "L40S" not in reason
    # Bus-starved money beside the wasted money: its hours x its price.
    (g,) = doc["gpus"]
    assert (g["link_bound_hours"], g["link_bound_cost"]) == (80.0, 200.0)
    assert (doc["totals"]["link_bound_hours"], doc["totals"]["link_bound_cost"]) == (80.0, 200.0)
    for text in (as_table(doc), as_markdown(doc), as_html(doc)):
        assert "Link-bound 80.0 GPU-hours (held with the PCIe link 90% full or more), which cost $200" in text
        assert "fix the PCIe link" in text and "then size it again" in text


def test_a_link_at_its_maximum_but_full_while_activity_is_low_is_named_too() -> None:
    r = empty()
    starved(r, bound_s=50 * 3600)
    r["links"] = [row for row in r["links"] if row[0]["what"] not in ("pcie_gen", "pcie_width")]
    r["links"] += [({**KEY, "what": "pcie_gen"}, 5.0), ({**KEY, "what": "pcie_width"}, 16.0)]
    (rec,) = build(W, r, CATALOGUE, OPTS)["recommendations"]
    assert rec["kind"] == "link" and "waits on the bus" in rec["reason"] and "trained below" not in rec["reason"]


def test_a_healthy_link_leaves_the_sizing_alone() -> None:
    r = empty()
    starved(r, bound_s=0.0)
    r["links"] = [row for row in r["links"] if row[0]["what"] not in ("pcie_gen", "pcie_width")]
    r["links"] += [({**KEY, "what": "pcie_gen"}, 5.0), ({**KEY, "what": "pcie_width"}, 16.0)]
    r["pcie_load"] = [({**KEY, "what": "rx"}, 0.2)]
    doc = build(W, r, CATALOGUE, OPTS)
    (rec,) = doc["recommendations"]
    assert rec["kind"] == "card" and doc["totals"]["link_bound_hours"] == 0.0


def test_link_bound_time_is_never_more_than_the_time_held() -> None:
    """The bound time counts whole steps, the held time the counters' seconds: a step more bound than
    held (the range's last, partly held) is the held time."""
    r = empty()
    starved(r, bound_s=(W.hours + 0.25) * 3600)
    (g,) = build(W, r, CATALOGUE, OPTS)["gpus"]
    assert (g["link_bound_hours"], g["link_bound_cost"]) == (W.hours, W.hours * 2.5)


def test_two_exporters_on_one_node_label_are_told_apart_by_their_instance() -> None:
    """Two simulated exporters on one host, relabelled to one node: "GPU 1 on 127.0.0.1" twice was two
    GPUs no reader could tell apart.  Each is shown with its instance (or, where the instances do not
    tell them apart, its UUID), in the advice, the notes and the table."""
    r = empty()
    for port, uuid in ((9400, "GPU-a"), (9401, "GPU-b")):
        key = {"node": "127.0.0.1", "instance": f"127.0.0.1:{port}", "gpu": "1", "uuid": uuid}
        add_gpu(r, key, H100_PCIE, {"busy": W.hours}, price=2.5, holder={**JOB, "hpc_job": str(port)},
                peak=30 * GIB, activity=0.9)  # fmt: skip
    doc = build(W, r, CATALOGUE, OPTS)
    assert [g["shown_as"] for g in doc["gpus"]] == ["127.0.0.1 (127.0.0.1:9400)", "127.0.0.1 (127.0.0.1:9401)"]
    assert [g["node"] for g in doc["gpus"]] == ["127.0.0.1", "127.0.0.1"]  # the label itself, as it is
    table = as_table(doc)
    assert "GPU 1 on 127.0.0.1 (127.0.0.1:9400): no cheaper card fits" in table
    assert "GPU 1 on 127.0.0.1 (127.0.0.1:9401): no cheaper card fits" in table
    # Where the instance does not tell them apart (one target, two UUIDs at one index): the UUID.
    r = empty()
    for uuid in ("GPU-a", "GPU-b"):
        add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "1", "uuid": uuid}, H100_PCIE, {"busy": W.hours},
                price=2.5, holder={**JOB, "hpc_job": uuid}, peak=30 * GIB, activity=0.9)  # fmt: skip
    assert [g["shown_as"] for g in build(W, r, CATALOGUE, OPTS)["gpus"]] == ["n1 (GPU-a)", "n1 (GPU-b)"]
    # One GPU of its index on its node: the node.
    r = empty()
    plain_h100(r, links=0)
    (g,) = build(W, r, CATALOGUE, OPTS)["gpus"]
    assert g["shown_as"] == "n1"
