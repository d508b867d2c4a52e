"""Issue 37's "plus each new card": one GPU of each card the catalogue gained in 09c84da (H200, H20,
B200, GB200, A30, A10, A10G, L40, RTX PRO 6000 Blackwell, H100 NVL), named as NVML names it on real
drivers (tests/fakenvml/presets.py, CARDS_2026, cites where each name and memory total was seen),
on one fake node scraped by a real Prometheus and a real VictoriaMetrics for a minute, and
``gpu-exporter report`` asking each.  A GH200 and an L40S sit beside them: near names that must not
be taken for an H200 or an L40.

Each card's work is what makes its advice tell: light work goes to a cheaper card or a MIG slice of
its own card, a busy B200 keeps its card, the pair of H100 NVLs moving data over their bridge gets
one advice for both with NVLink.  Before 09c84da none of these cards was in the catalogue (an H100
NVL was read as an H100 SXM): none got advice, or the wrong one.

The figures are the shipped catalogue's and ``PRICING``'s: a saving is (the price now - the price of
the advice) x GPUs x 730 h a month; a MIG slice of its own card costs its share of the card.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.report.catalogue import load_catalogue
from tests import assert_mentions
from tests.fakenvml.presets import GIB, b200, card_2026, gb200, l40s
from tests.fakenvml.scenario import Counter, Scenario
from tests.rightsizing_live_helpers import ENGINES, ME, a_minute_in_both_stores, advice, config, reasons, report

pytestmark = pytest.mark.integration

# Figures for the tests, not quotes.  Every card has its own key: the daemon prices a GPU by the
# longest key its name contains ("H20" is in "NVIDIA H200", "B200" in "NVIDIA GB200").
PRICING: dict[str, Any] = {"currency": "USD", "models": {
    "H200": 4.00, "H20": 2.20, "B200": 8.00, "GB200": 9.00, "A30": 1.10, "A10": 1.05, "A10G": 1.10, "L40": 1.20,
    "RTX PRO 6000": 1.80, "H100 NVL": 3.20, "H100": 3.00, "GH200": 4.50, "L40S": 1.40, "L4": 0.80, "A100": 2.00,
    "T4": 0.35}}  # fmt: skip
JOB, JOB_GPUS = "777", ("9", "10")
# NVLink data each way per link of the H100 NVL pair, KiB/s: 12 links x 4,000,000 x 1024 = 49 GB/s.
LINK_KIB_PER_S = 4_000_000
# GPU index: (NVML name, GiB used, the work).  GPM cards (Hopper, Blackwell) get their pipes; the
# others (Ampere, Ada) only GPU-Util, so every pipe is taken to be as busy.
GPM = ("sm_util", "any_tensor_util", "dram_bw_util", "fp64_util", "fp32_util", "fp16_util")
NODE: dict[str, tuple[str, int, int | tuple[float, ...]]] = {
    "0": ("NVIDIA H200", 60, (40, 30, 40, 0, 5, 2)),  # a 60 GiB model at 40%: an H100's 80 GB and 989 TFLOPS do
    "1": ("NVIDIA H20", 30, (25, 20, 15, 0, 4, 0)),
    "2": ("NVIDIA B200", 100, (60, 50, 45, 0, 8, 0)),  # 60% of 2,250 TFLOPS: no cheaper card is as fast
    "3": ("NVIDIA GB200", 20, (15, 10, 8, 0, 2, 0)),
    "4": ("NVIDIA A30", 4, 15),
    "5": ("NVIDIA A10", 14, 45),  # 45% of 600 GB/s is 270: an L4's 300 hold it
    "6": ("NVIDIA A10G", 6, 20),
    "7": ("NVIDIA L40", 10, 20),
    "8": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 30, (35, 25, 30, 0, 10, 0)),
    "9": ("NVIDIA H100 NVL", 30, (20, 15, 15, 0, 3, 0)),
    "10": ("NVIDIA H100 NVL", 30, (20, 15, 15, 0, 3, 0)),
    "11": ("NVIDIA GH200 480GB", 40, (30, 20, 20, 0, 4, 0)),  # not in the catalogue: no sizing
    "12": ("NVIDIA L40S", 12, 20),
}
# What a platform engineer would sign, per card: (kind, suggested, saving a month, facts its reason
# carries besides the card's NVML name and memory).  A slice of its own card costs its share of
# this GPU's price (4 compute slices on an A30 and an RTX PRO 6000).
EXPECTED: dict[str, tuple[str, str, float, tuple[str, ...]]] = {
    "0": ("card", "H100 80GB", (4.00 - 3.00) * 730, ("40% SM activity", "40% DRAM bandwidth", "tensor 30%",
                                                      "$3.00/h", "$4.00/h", "$730/month")),
    "1": ("mig", "A100 80GB MIG 3g.40gb", (2.20 - 2.00 * 3 / 7) * 730, ("25% SM activity", "tensor 20%", "$0.86/h",
                                                                         "$2.20/h", "$980/month")),
    "3": ("mig", "H100 80GB MIG 3g.40gb", (9.00 - 3.00 * 3 / 7) * 730, ("15% SM activity", "$1.29/h", "$9.00/h",
                                                                         "$5,631/month")),
    "4": ("mig", "A30 MIG 1g.6gb", (1.10 - 1.10 / 4) * 730, ("15% GPU utilization", "$0.28/h (this GPU's price)",
                                                              "$1.10/h", "$602/month")),
    "5": ("card", "L4", (1.05 - 0.80) * 730, ("45% GPU utilization", "$0.80/h", "$1.05/h", "$182/month")),
    "6": ("mig", "A100 80GB MIG 1g.10gb", (1.10 - 2.00 / 7) * 730, ("20% GPU utilization", "$0.29/h", "$1.10/h",
                                                                     "$594/month")),
    "7": ("mig", "RTX PRO 6000 Blackwell MIG 1g.24gb", (1.20 - 1.80 / 4) * 730, ("20% GPU utilization", "$0.45/h",
                                                                                   "$1.20/h", "$548/month")),
    "8": ("mig", "RTX PRO 6000 Blackwell MIG 2g.48gb", (1.80 - 1.80 / 2) * 730, ("35% SM activity", "FP32 10%",
                                                                                   "$0.90/h (this GPU's price)",
                                                                                   "$1.80/h", "$657/month")),
    "9": ("card", "A100 40GB", (3.20 - 2.00) * 2 * 730, (f"job {JOB} of {ME}", "2 GPUs: 9, 10 on node-a",
                                                          "2 x A100 40GB (NVLink, 300 GB/s each way)",
                                                          "$2.00/h each", "$3.20/h each", "$1,752/month")),
    "12": ("card", "L4", (1.40 - 0.80) * 730, ("20% GPU utilization", "$0.80/h", "$1.40/h", "$438/month")),
}  # fmt: skip
BUSY, UNKNOWN = "2", "11"


def node(path: Path, pids: dict[str, int]) -> Scenario:
    s = Scenario(path, comment="issue 37: one GPU of each 2026 card, a GH200 and an L40S, driver 580")
    s.driver(580)
    for gpu, (name, used_gib, work) in NODE.items():
        i, used = int(gpu), used_gib * GIB
        util = work if isinstance(work, int) else int(work[0]) + 5
        if name == "NVIDIA B200":
            g = b200(s.add_gpu(), "cards", i, util=util, mem_used=used, power_mw=800_000)
        elif name == "NVIDIA GB200":
            g = gb200(s.add_gpu(), "cards", i, util=util, mem_used=used, power_mw=500_000)
        elif name == "NVIDIA L40S":
            g = l40s(s.add_gpu(), "cards", i, util=util, mem_used=used)
        else:
            g = card_2026(s.add_gpu(), name, "cards", i, util=util, mem_used=used)
        if not isinstance(work, int):
            g.gpm(graphics_util=util, **dict(zip(GPM, work, strict=True)))
        # The presets' B200s move data over every link; here only the job does.
        links = g.values.get("nvlink.count", 0)
        for link in range(links if isinstance(links, int) else 0):
            rate = LINK_KIB_PER_S if gpu in JOB_GPUS else 0
            g.nvlink(link, True, tx_kib=Counter(0, rate) if rate else 0, rx_kib=Counter(0, rate) if rate else 0)
        g.add_process(pids["job" if gpu in JOB_GPUS else "work"], used, name="python3", sm=util)
    return s


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Iterator[dict[str, Any]]:
    """A minute of the cards in both stores: each engine's URL, and the range to report on."""
    tmp = tmp_path_factory.mktemp("cards")
    sleepers = {k: subprocess.Popen(["sleep", "600"]) for k in ("work", "job")}
    try:
        s = node(tmp / "node.scn", {k: p.pid for k, p in sleepers.items()})
        s.write()
        cfg = config(tmp, PRICING, dict.fromkeys(JOB_GPUS, JOB))
        with a_minute_in_both_stores(s.path, cfg, tmp, len(NODE)) as live:
            yield live
    finally:
        for p in sleepers.values():
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def docs(live: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {engine: report(live, engine) for engine in ENGINES}


@pytest.fixture(scope="module")
def slower_docs(live: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {engine: report(live, engine, "--allow-slower") for engine in ENGINES}


def row(doc: dict[str, Any], gpu: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [g for g in doc["gpus"] if g["gpu"] == gpu]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("gpu", list(EXPECTED))
@pytest.mark.parametrize("engine", ENGINES)
def test_each_new_card_is_recognised_and_sized(docs: dict[str, dict[str, Any]], engine: str, gpu: str) -> None:
    """The card is known as itself (its NVML name and the memory it used in the advice), and the
    advice carries the card suggested, the saving and the figures of the reason."""
    doc = docs[engine]
    name, used_gib, _ = NODE[gpu]
    kind, suggested, saving, facts = EXPECTED[gpu]
    r = advice(doc, gpu)
    assert r is not None, reasons(doc)
    assert (r["kind"], r["suggested"], r["current_model"]) == (kind, suggested, name), r["reason"]
    assert r["saving_per_month"] == pytest.approx(saving, abs=0.01), r["reason"]
    assert_mentions(r["reason"], f"on {name} (", f"at most {used_gib:.1f} GiB", "at least as fast", *facts)
    assert row(doc, gpu)["memory_total_bytes"] > used_gib * GIB


@pytest.mark.parametrize("engine", ENGINES)
def test_no_advice_asks_for_less_than_the_work_used(docs: dict[str, dict[str, Any]], engine: str) -> None:
    """Every card or slice suggested holds the work's highest memory x 1.2, has the compute its SM
    activity (else GPU-Util) used of its own card, and carries the NVLink traffic it had."""
    cat, doc = load_catalogue(), docs[engine]
    offers = {o.name: o for o in cat.offers}
    assert doc["recommendations"], doc["gpus"]
    for r in doc["recommendations"]:
        offer, own = offers[r["suggested"]], cat.card_of(r["current_model"])
        assert own is not None, r
        for gpu in re.split(r",\s*", r["gpu"]):
            g = row(doc, gpu)
            assert offer.memory_bytes >= 1.2 * g["memory_peak_bytes"], r["reason"]
            assert offer.fp16_tflops >= g["activity_p95"] * own.fp16_tflops * (1 - 1e-6), r["reason"]
        moved = re.search(r"NVLink (\d+) GB/s each way", r["reason"])
        if moved is not None:
            assert not offer.mig and offer.nvlink_gbps_each_way >= int(moved.group(1)), r["reason"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_nvl_pair_moving_data_gets_one_advice_with_nvlink(docs: dict[str, dict[str, Any]], engine: str) -> None:
    """The two H100 NVLs of job 777 send 49 GB/s each way over their bridge (12 links x 4,000,000
    KiB/s): one advice names both, a card with NVLink, never a MIG slice (no peer-to-peer)."""
    doc = docs[engine]
    covering = [r for r in doc["recommendations"] if set(re.split(r",\s*", r["gpu"])) & set(JOB_GPUS)]
    assert len(covering) == 1, reasons(doc)
    (r,) = covering
    assert r["gpu"] == ", ".join(JOB_GPUS) and r["gpus"] == 2 and "MIG" not in r["reason"], r["reason"]
    moved = re.search(r"NVLink (\d+) GB/s each way", r["reason"])
    # Never less than it moved; under load a scrape may read a poll's counters late and the next one
    # catch up, so a step's rate may run high, but never as high as the links counted twice (98).
    assert moved is not None and 45 <= int(moved.group(1)) < 90, r["reason"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_busy_b200_keeps_its_card(docs: dict[str, dict[str, Any]], slower_docs: dict[str, dict[str, Any]],
                                    engine: str) -> None:  # fmt: skip
    """60% of a B200's 2,250 TFLOPS is 1,350: no cheaper card is as fast, so no advice; asked for
    slower cards too, an H200 (989) would take about 1.4x as long, and the advice says so."""
    told = advice(docs[engine], BUSY)
    assert told is None, told["reason"]
    r = advice(slower_docs[engine], BUSY)
    assert r is not None, reasons(slower_docs[engine])
    assert (r["kind"], r["suggested"], r["saving_per_month"]) == ("slower", "H200", None), r["reason"]
    assert r["slowdown"] == pytest.approx(0.60 * 2250 / 989.4, abs=0.02), r["reason"]
    assert_mentions(r["reason"], "on NVIDIA B200 (", "at most 100.0 GiB", "60% SM activity", "tensor 50%",
                    "no cheaper card is as fast", "1.4x as long", "$4.00/h", "$8.00/h")  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_near_names_are_not_taken_for_a_catalogue_card(
    docs: dict[str, dict[str, Any]], slower_docs: dict[str, dict[str, Any]], engine: str
) -> None:
    """A GH200 is no H200 (not in the catalogue: no sizing at all), an L40S no L40 (its own rates: an
    L4, not an L40 that lacks its FP64), a GB200 no B200, an A10G no A10, an H100 NVL no H100 SXM."""
    for doc in (docs[engine], slower_docs[engine]):
        gh = advice(doc, UNKNOWN)
        assert gh is None, gh["reason"]
        assert row(doc, UNKNOWN)["model"] == "NVIDIA GH200 480GB"
        assert "GH200" not in reasons(doc)
    by_gpu = {r["gpu"]: r for r in docs[engine]["recommendations"]}
    assert by_gpu["12"]["current_model"] == "NVIDIA L40S" and by_gpu["12"]["suggested"] != "L40"
    assert by_gpu["3"]["current_model"] == "NVIDIA GB200" and "B200 MIG" not in by_gpu["3"]["suggested"]
    assert by_gpu["6"]["suggested"] != by_gpu["5"]["suggested"]  # an A10G's 70 TFLOPS are no A10's 125
    assert "H100 80GB" not in by_gpu["9, 10"]["reason"]


def test_both_engines_give_the_same_advice(
    docs: dict[str, dict[str, Any]], slower_docs: dict[str, dict[str, Any]]
) -> None:
    """Prometheus and VictoriaMetrics scraped the same daemon: the same cards, GPUs and savings."""
    for d in (docs, slower_docs):
        p, v = ([(r["kind"], r["gpu"], r["suggested"], r["saving_per_month"]) for r in d[e]["recommendations"]]
                for e in ENGINES)  # fmt: skip
        assert p == v
