"""The books of a card in MIG mode, per GPU instance (issue 48, point 1): each slice's share of the card,
its own state and holders, and the card kept whole where the cut cannot be told.  The daemon end to
end, and the report on a real Prometheus, are in tests/test_mig_books_live.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.states import (
    ALLOCATED_IDLE,
    ALLOCATED_UNKNOWN,
    BUSY,
    IDLE,
    NOBODY,
    WHOLE,
    parts,
    slices_of,
)
from gpu_exporter.snapshot import Activity, GpuReading, GpuStatic, MigReading, NodeSnapshot, ProcessReading

GIB = 1024**3
T0 = 1_800_000_000.0
THRESHOLD = 0.10
A30 = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA A30", pci_bus_id="00000000:18:00.0", mig_mode="enabled")


def proc(pid: int, user: str) -> ProcessReading:
    return ProcessReading(pid, "python3", GIB, user=user)


def mig(index: int, profile: str, gi: int | None, sm: float | None = None, *procs: ProcessReading,
        ci: int = 0) -> MigReading:  # fmt: skip
    """A MIG device: ``sm``, its GPU instance's SM activity (GPM), None where none is given."""
    return MigReading(index, f"MIG-{index}", profile, gi, ci, processes=procs,
                      activity=None if sm is None else Activity(sm=sm))  # fmt: skip


def card(*migs: MigReading, slices: int | None = 4, **kw: Any) -> GpuReading:
    # In MIG mode the parent lists every instance's processes, and has no GPU-Util.
    every = tuple(p for m in migs for p in m.processes)
    return GpuReading(index=0, uuid="GPU-0", up=True, static=A30, utilization_ratio=None, processes=every,
                      migs=migs, mig_slices=slices, **kw)  # fmt: skip


def cut(g: GpuReading, signal: str = "auto") -> dict[str, tuple[float, str, list[str]]]:
    return {
        p.instance: (round(p.share, 9), p.state, [h.name for h, _ in p.holders]) for p in parts(g, THRESHOLD, signal)
    }


@pytest.mark.parametrize(("profile", "slices"), [("1g.10gb", 1), ("1g.20gb", 1), ("1g.10gb+me", 1), ("2g.20gb", 2),
                                                  ("3g.40gb", 3), ("7g.80gb", 7), ("1c.7g.80gb", 7), ("unknown", None),
                                                  ("0g.1gb", None)])  # fmt: skip
def test_a_profile_names_its_gpu_instances_compute_slices(profile: str, slices: int | None) -> None:
    assert slices_of(profile) == slices


def test_an_a30_is_cut_in_fourths_and_what_no_instance_takes_is_idle() -> None:
    """An A30 has 4 compute slices (nvmlDeviceGetMaxMigDeviceCount 4): a 1g is a quarter of it, a 2g half;
    with one 1g and one 2g, the fourth quarter is idle, held by nobody."""
    g = card(mig(0, "2g.12gb", 1, 0.6, proc(1, "alice")), mig(1, "1g.6gb", 5, 0.0, proc(2, "bob")))
    assert cut(g) == {"1": (0.5, BUSY, ["user alice"]), "5": (0.25, ALLOCATED_IDLE, ["user bob"]),
                      WHOLE: (0.25, IDLE, [NOBODY.name])}  # fmt: skip


def test_a_gpu_instances_compute_instances_are_one_slice_with_its_activity() -> None:
    """GPM is per GPU instance, shown on one of its compute instances: the instance is one part, at its
    GPU instance's share, held by the holders of every compute instance."""
    g = card(mig(0, "1c.2g.12gb", 1, 0.03, proc(1, "alice")), mig(1, "1c.2g.12gb", 1, None, proc(2, "bob"), ci=1),
             mig(2, "2g.12gb", 2, 0.0), slices=4)  # fmt: skip
    assert cut(g) == {"1": (0.5, ALLOCATED_IDLE, ["user alice", "user bob"]), "2": (0.5, IDLE, [NOBODY.name])}


def test_a_held_slice_without_activity_is_held_activity_unknown() -> None:
    """No GPM (an A100, an A30), or GPU-Util asked for (never given per MIG device): held, unknown."""
    g = card(mig(0, "2g.12gb", 1, None, proc(1, "alice")), mig(1, "2g.12gb", 2, None))
    assert cut(g) == {"1": (0.5, ALLOCATED_UNKNOWN, ["user alice"]), "2": (0.5, IDLE, [NOBODY.name])}
    g = card(mig(0, "2g.12gb", 1, 0.9, proc(1, "alice")), mig(1, "2g.12gb", 2, 0.9))
    assert cut(g, "gpu_utilization")["1"][1] == ALLOCATED_UNKNOWN


@pytest.mark.parametrize("broken", ["no card slices", "no instance id", "no profile", "more than the card"])
def test_a_cut_that_cannot_be_told_keeps_the_card_whole(broken: str) -> None:
    """Where the card's slices, an instance's id or its profile are unknown, or the instances add up to more
    than the card, the card keeps one book: in MIG mode it has no activity, so held it is unknown."""
    migs = [mig(0, "2g.12gb", 1, 0.9, proc(1, "alice")), mig(1, "2g.12gb", 2, 0.9)]
    slices: int | None = 4
    if broken == "no card slices":
        slices = None
    elif broken == "no instance id":
        migs[1] = mig(1, "2g.12gb", None, 0.9)
    elif broken == "no profile":
        migs[1] = mig(1, "unknown", 2, 0.9)
    else:
        migs.append(mig(2, "1g.6gb", 3, 0.9))  # 2 + 2 + 1 of 4
        slices = 4
        migs[1] = mig(1, "3g.18gb", 2, 0.9)
    assert cut(card(*migs, slices=slices)) == {WHOLE: (1.0, ALLOCATED_UNKNOWN, ["user alice"])}


def test_the_books_weight_each_slice_by_its_share_and_add_up_to_the_cards_time() -> None:
    acc = Accountant(threshold=THRESHOLD)
    g = card(mig(0, "2g.12gb", 1, 0.6, proc(1, "alice")), mig(1, "1g.6gb", 5, 0.0, proc(2, "bob")))
    for t in (0.0, 8.0):
        acc.observe(NodeSnapshot(taken_at=T0 + t, duration_seconds=0.05, nvml_up=True, gpus=(g,), monotonic_at=t))
    (a,) = acc.view().gpus
    got = {(i, h.name, s): v for i, h, s, v in a.instance_seconds if v}
    assert got == {("1", "user alice", BUSY): 4.0, ("5", "user bob", ALLOCATED_IDLE): 2.0}
    assert {(h.name, s): v for h, s, v in a.seconds if v} == {(NOBODY.name, IDLE): 2.0}
    assert a.state == BUSY  # the card: its busiest slice's


# -- GpuUnderutilized per slice ----------------------------------------------------------------------------
def test_underutilized_fires_for_each_idle_slice_and_not_for_the_busy_one() -> None:
    """Seven 1g slices of an H100, two busy, five held idle: five alerts, one per idle slice (labelled with
    its GPU instance), none for the card.  An A100's slices (no GPM) say nothing: unknown is not idle."""
    from gpu_exporter.alerting.engine import FIRING, RuleEngine
    from gpu_exporter.settings.config import load_settings

    h100 = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")
    busy = (7, 8)
    migs = tuple(mig(i, "1g.10gb", gi, 0.8 if gi in busy else 0.0, proc(100 + gi, f"u{gi}"))
                 for i, gi in enumerate(range(7, 14)))  # fmt: skip
    a100 = tuple(mig(i, "3g.40gb", gi, None, proc(200 + gi, f"a{gi}")) for i, gi in enumerate((1, 2)))
    cards = (replace(card(*migs, slices=7, activity=Activity(sm=0.03)), static=h100),
             replace(card(*a100, slices=7), index=1, uuid="GPU-1"))  # fmt: skip
    engine = RuleEngine(load_settings({"rules": {"GpuUnderutilized": {"for": "1m"}}}).rules, "node-a",
                        resend_interval=3600)  # fmt: skip
    sent = [a for i in range(40) for a in engine.evaluate(
        NodeSnapshot(taken_at=T0 + 5 * i, duration_seconds=0.05, nvml_up=True, gpus=cards, monotonic_at=5.0 * i)
    ).to_send]  # fmt: skip
    firing = {(a.label_dict["gpu"], a.label_dict.get("gpu_instance_id")) for a in sent
              if a.state == FIRING and a.label_dict["alertname"] == "GpuUnderutilized"}  # fmt: skip
    assert firing == {("0", str(gi)) for gi in range(9, 14)}
    summary = dict(next(a for a in sent if a.label_dict.get("gpu_instance_id") == "9").annotations)["summary"]
    assert summary == "MIG slice 9 (1g.10gb) of GPU 0 (NVIDIA H100 80GB HBM3) is allocated but idle"


def test_the_cards_slices_are_nvmls_most_mig_devices(scenario: Any, nvml: Any) -> None:
    """nvmlDeviceGetMaxMigDeviceCount: 4 on an A30 (the fake's ``mig.max_devices``), 7 on an A100 or H100;
    out of MIG mode there is no cut (None)."""
    from tests.exporter_helpers import make_poller
    from tests.fakenvml.presets import mig_uuid

    a30 = scenario.add_gpu().identity("NVIDIA A30", "GPU-a3000000-0000-4000-8000-000000000000")
    a30.memory(24 * GIB, GIB).mig_mode(True, max_devices=4)
    a30.add_mig("NVIDIA A30 MIG 1g.6gb", mig_uuid("slices", 0, 0), 3).memory(6 * GIB, GIB)
    a30.add_process(61_000, GIB, name="python3", gpu_instance_id=3, compute_instance_id=0)
    scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-a1000000-0000-4000-8000-000000000001").memory(
        80 * GIB, 0
    ).mig_mode(False)
    scenario.write()
    poller, _ = make_poller()
    a, whole = poller.poll().gpus
    assert (a.mig_slices, whole.mig_slices) == (4, None)
    # Its one 1g slice is a quarter of the card, held (no GPM on an A30: activity unknown); the rest idle.
    assert cut(a) == {"3": (0.25, ALLOCATED_UNKNOWN, [a.migs[0].processes[0].holder.name]), WHOLE: (0.75, IDLE, [""])}
    poller.close()


def test_once_says_what_a_mig_card_wastes_now_by_its_idle_slices() -> None:
    """``--once``: the card is busy (its busiest slice), and wastes the share of its price its idle slices
    take: 5/7 of 4.00 an hour for five idle 1g slices of seven."""
    from gpu_exporter.accounting.pricing import PriceBook
    from gpu_exporter.accounting.settings import PricingSettings
    from gpu_exporter.once import cost_now

    h100 = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")
    migs = tuple(mig(i, "1g.10gb", gi, 0.8 if gi < 9 else 0.0, proc(100 + gi, f"u{gi}"))
                 for i, gi in enumerate(range(7, 14)))  # fmt: skip
    snap = NodeSnapshot(taken_at=T0, duration_seconds=0.05, nvml_up=True,
                        gpus=(replace(card(*migs, slices=7), static=h100),))  # fmt: skip
    cost = cost_now(snap, prices=PriceBook(PricingSettings(currency="USD", models={"H100": 4.0})))
    assert cost.gpus == {0: (BUSY, 4.0)}
    assert cost.waste_per_hour == pytest.approx(4.0 * 5 / 7)


# -- the report's advice on a MIG card ---------------------------------------------------------------------
def test_a_mig_card_with_a_slice_that_worked_is_never_released_and_its_idle_slices_are_reclaimed() -> None:
    """Over 100 h, GPU 0: slice 1 (a 1g of 7) busy for 5 h, then unheld, the rest nobody's: the card sat
    idle 99% of the time, which would release a whole GPU, but not a card a slice worked on.  GPU 1:
    slice 2 held idle all along by bob, the rest nobody's: bob's slice is reclaimed at a seventh of the
    card's price, the card is not released."""
    from gpu_exporter.report.model import build
    from tests.test_report_model import CATALOGUE, H100, W, add_gpu, empty

    r = empty()
    worked, held = ({"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-m{i}"} for i in (0, 1))
    for key in (worked, held):
        add_gpu(r, key, H100, {}, price=4.0, mig_mode="enabled")
    r["hours"] = [({**worked, "user": "alice", "gpu_instance_id": "1", "state": "busy"}, 5 / 7),
                  ({**worked, "gpu_instance_id": "1", "state": "idle"}, 95 / 7),
                  ({**worked, "gpu_instance_id": "", "state": "idle"}, 600 / 7),
                  ({**held, "user": "bob", "gpu_instance_id": "2", "state": "allocated_idle"}, 100 / 7),
                  ({**held, "gpu_instance_id": "", "state": "idle"}, 600 / 7)]  # fmt: skip
    doc = build(W, r, CATALOGUE)
    (rec,) = doc["recommendations"]
    assert (rec["gpu"], rec["kind"], rec["gpu_instance_id"], rec["suggested"]) == ("1", "reclaim", "2",
                                                                                   "reclaim from user bob")  # fmt: skip
    assert rec["saving_per_month"] == pytest.approx(4.0 * 730 / 7)
    g0, g1 = doc["gpus"]
    assert [(x["gpu_instance_id"], x["share"], x["holder"]) for x in g0["slices"]] == [("1", round(1 / 7, 4),
                                                                                          "user alice")]  # fmt: skip
    assert g1["wasted_cost"] == pytest.approx(400.0) and g1["slices"][0]["wasted_cost"] == pytest.approx(400 / 7)


def test_two_slices_held_by_one_container_id_of_two_engines_are_reclaimed_from_each_by_name() -> None:
    """A rootless docker@1000 container and the system engine's of the same ID hold two idle slices: the
    holders table tells them apart by engine, and so must each slice's row and its reclaim (the MIG and
    the container-engine parts met in one merge, and the slices named both "container train")."""
    from gpu_exporter.report.model import build
    from tests.test_report_model import CATALOGUE, H100, W, add_gpu, empty

    r = empty()
    key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-m0"}
    add_gpu(r, key, H100, {}, price=7.0, mig_mode="enabled")
    held = {"container_id": "abc", "container_name": "train"}
    r["hours"] = [({**key, **held, "container_engine": "docker", "gpu_instance_id": "1",
                    "state": "allocated_idle"}, 100 / 7),
                  ({**key, **held, "container_engine": "docker@1000", "gpu_instance_id": "2",
                    "state": "allocated_idle"}, 100 / 7),
                  ({**key, "gpu_instance_id": "", "state": "idle"}, 500 / 7)]  # fmt: skip
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    rows = {x["gpu_instance_id"]: x["holder"] for x in g["slices"]}
    assert rows["1"] != rows["2"] and "docker@1000" in rows["2"], rows
    reclaims = {rec["gpu_instance_id"]: rec["suggested"] for rec in doc["recommendations"]}
    assert reclaims["1"] != reclaims["2"] and "docker@1000" in reclaims["2"], reclaims
