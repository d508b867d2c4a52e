"""Issue 37: the work is judged by what it uses (each pipe, the memory bandwidth, NVLink, its
bursts), an unknown signal is not a zero, and the catalogue knows the cards of 2026.

The four kinds of advice an independent truth test found would buy the wrong card, each worked out
by hand from the shipped catalogue's datasheet figures (dense TFLOPS, GB/s):

1. FP64: an H100 job keeping its FP64 pipe 28% busy needs 0.28 x 34 = 9.5 TFLOPS of FP64; an L40S
   does about 1.4, so it would take about 7x as long: never "at least as fast".
2. No GPM: an A100 at 30% GPU-Util may stream up to 0.30 x 2,039 = 612 GB/s; an L4 has 300.
3. NVLink: 270 GB/s each way between a job's H100s; an L40S has no NVLink, PCIe Gen4 x16 carries 32.
4. Bursts: an endpoint idling at 13% SM that bursts to 95% of an H100 needs 0.95 x 989.4 = 940
   TFLOPS at its bursts; a 1g.20gb slice has a seventh of that.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.report.catalogue import PIPES, load_catalogue
from gpu_exporter.report.prices import PriceList
from gpu_exporter.report.rightsizing import CARD, MIG, SLOWER, Sizer, Usage
from tests import assert_mentions

GIB = 1024**3
SHIPPED = load_catalogue()
H100, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
# Every card of the catalogue at a price below the H100's and the A100's, so that only what the work
# needs decides.
PRICES = {"T4": 0.30, "L4": 0.45, "A10": 0.60, "A10G": 0.60, "L40": 0.80, "L40S": 0.90, "A30": 0.70,
          "RTX 6000 Ada": 0.85, "RTX PRO 6000 Blackwell": 1.10, "A100 40GB": 1.20, "A100 80GB": 1.60,
          "A100 80GB PCIe": 1.50, "H100 PCIe": 2.00, "H20": 1.00, "H100 80GB": 2.50}  # fmt: skip


def sizer(**kw: Any) -> Sizer:
    return Sizer(SHIPPED, PriceList(SHIPPED, "USD", PRICES, None), **kw)


def job(model: str, activity: float, *, peak_gib: float = 10, price: float = 2.50, signal: str = "SM activity",
        **kw: Any) -> Usage:  # fmt: skip
    """A job held for 720 h; with GPM unless ``pipes`` says None."""
    known: dict[str, Any] = {"pipes": dict.fromkeys(PIPES, 0.0), "dram_p95": 0.05, "nvlink_bytes_per_second": 0.0}
    return Usage(node="n1", gpu="0", uuid="GPU-n1-0", model=model, holder="job 4242", idle_holder="",
                 busy_hours=720, allocated_idle_hours=0, idle_hours=0, down_hours=0, price_per_hour=price,
                 memory_total_bytes=80 * GIB, memory_peak_bytes=peak_gib * GIB, activity_p95=activity,
                 activity_signal=signal, **(known | kw))  # fmt: skip


def offer_of(name: str) -> Any:
    return next(o for o in SHIPPED.offers if o.name == name)


def fast_enough(a: Any) -> bool:
    return a is not None and a.kind in (CARD, MIG)


# -- 1. FP64 ------------------------------------------------------------------------------------------
def test_fp64_work_is_never_sent_to_a_card_with_a_fraction_of_the_fp64() -> None:
    """The Slurm job of the issue: 35% SM, its FP64 pipe 28% busy on an H100. Judged on SM alone,
    0.35 x 989.4 = 346 TFLOPS fits an L40S (362.05, at 0.90 instead of 2.50): the old advice. Its FP64
    needs 9.5 TFLOPS: no card below the H100's price has that but an H100 PCIe (26) and an A100 (9.7)."""
    fp64 = job(H100, 0.35, pipes={"tensor": 0.0, "fp64": 0.28, "fp32": 0.05, "fp16": 0.0})
    a = sizer().advise(fp64)
    assert fast_enough(a) and a is not None
    offer = next(o for o in SHIPPED.offers if o.name == a.suggested)
    assert offer.fp64_tflops is not None and offer.fp64_tflops >= 0.28 * 34, a
    assert a.suggested not in ("L40S", "L40", "RTX PRO 6000 Blackwell")
    assert_mentions(a.reason, "FP64 28%", "35% SM activity")
    # Without the FP64 pipe a card with a fraction of the FP64 wins (as before): the pipe is what moved it.
    plain = sizer().advise(job(H100, 0.35))
    assert plain is not None and (offer_of(plain.suggested).fp64_tflops or 0) < 0.28 * 34, plain


def test_slower_for_fp64_says_how_much_slower_from_the_fp64_rates() -> None:
    """With --allow-slower, an H100 job whose FP64 pipe is 90% busy (30.6 TFLOPS) may be told to a card
    with FP64, and how much longer it takes: never a card whose FP64 the catalogue does not state."""
    a = sizer(allow_slower=True).advise(job(H100, 0.9, pipes={"tensor": 0.0, "fp64": 0.9, "fp32": 0.0, "fp16": 0.0}))
    assert a is not None and a.kind == SLOWER
    offer = next(o for o in SHIPPED.offers if o.name == a.suggested)
    assert offer.fp64_tflops is not None
    assert a.slowdown == pytest.approx(max(0.9 * 34 / offer.fp64_tflops, 0.9 * 989.4 / offer.fp16_tflops,
                                           0.05 * 3350 / offer.memory_bandwidth_gbps))  # fmt: skip


# -- 2. unknown is not zero -----------------------------------------------------------------------------
def test_without_gpm_the_bandwidth_is_taken_as_busy_as_gpu_util() -> None:
    """An A100 without GPM at 30% GPU-Util (the old advice: an L4). It may stream 612 GB/s: the L4's
    300 is out, and so is every card under 612 GB/s; the advice says what it assumed."""
    blind = job(A100, 0.30, price=1.60, signal="GPU utilization", pipes=None, dram_p95=None)
    a = sizer().advise(blind)
    if a is not None:
        offer = next(o for o in SHIPPED.offers if o.name == a.suggested)
        assert offer.memory_bandwidth_gbps >= 0.30 * 2039 and a.suggested != "L4", a
        assert offer.fp64_tflops is not None and offer.fp64_tflops >= 0.30 * 9.7, a
        assert_mentions(a.reason, "no pipe and DRAM activity", "30% GPU utilization")
    # With GPM saying DRAM 10% and no FP64, a card under 612 GB/s may hold it (204 GB/s is enough),
    # and nothing is said to be assumed.
    b = sizer().advise(job(A100, 0.30, price=1.60, dram_p95=0.10))
    assert b is not None and offer_of(b.suggested).memory_bandwidth_gbps < 0.30 * 2039, b
    assert "taken to" not in b.reason


def test_a_pipe_gpm_does_not_report_is_as_busy_as_the_activity() -> None:
    """GPM gave SM and DRAM but not the FP64 pipe: it counts as 28% busy with the SM, not idle."""
    partial = job(H100, 0.28, pipes={"tensor": 0.0, "fp32": 0.0, "fp16": 0.0})
    a = sizer().advise(partial)
    assert a is None or (next(o for o in SHIPPED.offers if o.name == a.suggested).fp64_tflops or 0) >= 0.28 * 34


def test_a_pipe_the_card_has_no_rate_for_means_no_card_is_claimed() -> None:
    """An RTX 6000 Ada job with its FP64 pipe busy: the catalogue states no FP64 rate for it, so what
    the job needs cannot be told, and nothing is claimed "at least as fast"."""
    ada = job("NVIDIA RTX 6000 Ada Generation", 0.2, price=0.85, pipes={"tensor": 0, "fp64": 0.3, "fp32": 0, "fp16": 0})
    assert sizer(allow_slower=True).advise(ada) is None
    (note,) = sizer().notes(ada)
    assert_mentions(note, "not sized", "FP64 30%", "no rate for that pipe on an RTX 6000 Ada", "--catalogue FILE")


def test_no_advice_for_an_unrated_pipe_says_why() -> None:
    """An H100 NVL whose work keeps the FP16 (non-tensor) pipe 2% busy: its datasheet column gives no
    FP16 non-tensor rate, so it is not sized, and its row says so rather than nothing; with the FP16
    pipe idle it is sized and has no note."""
    nvl = job("NVIDIA H100 NVL", 0.2, peak_gib=30, price=3.20, pipes={"tensor": 0.15, "fp64": 0, "fp32": 0.03,
                                                                      "fp16": 0.02})  # fmt: skip
    assert sizer(allow_slower=True).advise(nvl) is None
    (note,) = sizer().notes(nvl)
    assert_mentions(note, "not sized", "FP16 2%", "no rate for that pipe on an H100 NVL")
    idle_fp16 = job("NVIDIA H100 NVL", 0.2, peak_gib=30, price=3.20, pipes={"tensor": 0.15, "fp64": 0, "fp32": 0.03,
                                                                            "fp16": 0})  # fmt: skip
    assert sizer().notes(idle_fp16) == [] and fast_enough(sizer().advise(idle_fp16))


# -- 3. NVLink -------------------------------------------------------------------------------------------
def test_a_job_moving_data_over_nvlink_is_never_sent_to_a_card_without_it() -> None:
    """Job 4242's H100s move 270 GB/s each way over NVLink. At 30% SM and 10 GiB it would fit an L40S
    or a slice; neither has NVLink (a MIG slice has no peer-to-peer), so only a card whose NVLink
    carries 270 GB/s each way may be suggested: an A100 (600 GB/s, 300 each way)."""
    nvl = job(H100, 0.3, nvlink_bytes_per_second=270e9)
    a = sizer().advise(nvl)
    assert a is not None and a.kind == CARD
    offer = next(o for o in SHIPPED.offers if o.name == a.suggested)
    assert offer.nvlink_gbps_each_way * 1e9 >= 270e9 and not offer.mig, a
    assert_mentions(a.reason, "NVLink 270 GB/s each way")
    for allow_slower in (False, True):
        advised = sizer(allow_slower=allow_slower).advise(nvl)
        assert advised is not None and "L40S" not in advised.suggested and "MIG" not in advised.suggested
    # The same job without NVLink traffic: a slice, or a card without NVLink.
    alone = sizer().advise(job(H100, 0.3))
    assert alone is not None and (alone.kind == MIG or offer_of(alone.suggested).nvlink_gbps_each_way == 0), alone


def test_unknown_nvlink_traffic_keeps_the_cards_nvlink() -> None:
    """No NVLink counters in the store (the collector off): the job may have used its H100's 450 GB/s
    each way, so only cards with as much are considered, and the advice says why."""
    a = sizer().advise(job(H100, 0.3, nvlink_bytes_per_second=None))
    assert a is None or next(o for o in SHIPPED.offers if o.name == a.suggested).nvlink_gbps_each_way >= 450
    # An L4 has no NVLink: unknown traffic asks nothing of the candidate.
    b = sizer().advise(job(L4, 0.3, price=0.45, peak_gib=4, nvlink_bytes_per_second=None))
    assert b is None or "NVLink" not in b.reason


# -- 4. bursts -------------------------------------------------------------------------------------------
def test_an_endpoint_is_sized_by_its_bursts() -> None:
    """The endpoint bursts to 95% of an H100 (the p95 of each step's highest poll): 940 TFLOPS, which
    no slice and no cheaper card has. Its mean (13%) would have fitted a 1g.20gb slice (141)."""
    burst = job(H100, 0.95, peak_gib=15)
    assert sizer().advise(burst) is None
    mean = sizer().advise(job(H100, 0.13, peak_gib=15))
    assert mean is not None and mean.kind == MIG
    assert_mentions(mean.reason, "bursts reaching 13% SM activity")


# -- the cards of 2026 ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nvml_name", "card"),
    [("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("NVIDIA H20", "H20"),
     ("NVIDIA A10", "A10"), ("NVIDIA A10G", "A10G"), ("NVIDIA A30", "A30"), ("NVIDIA L40", "L40"),
     ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell"), ("NVIDIA L40S", "L40S"),
     ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H100 PCIe", "H100 PCIe"),
     ("NVIDIA GH200 480GB", None), ("NVIDIA H200 NVL", None)],
)  # fmt: skip
def test_each_card_of_2026_is_known_by_its_nvml_name(nvml_name: str, card: str | None) -> None:
    """A near name is not the card: GH200 is no H200, L40S no L40, A100 no A10, and a card the
    catalogue does not have (H200 NVL, GH200) gets no advice rather than another card's figures."""
    got = SHIPPED.card_of(nvml_name)
    assert (got.name if got else None) == card


@pytest.mark.parametrize("card", ["H200", "B200", "GB200", "H20", "A10", "A10G", "A30", "L40",
                                  "RTX PRO 6000 Blackwell"])  # fmt: skip
def test_each_card_of_2026_has_its_rates_memory_links_and_slices(card: str) -> None:
    c = next(o for o in SHIPPED.offers if o.name == card)
    assert c.fp16_tflops > 0 and c.memory_bandwidth_gbps > 0 and c.memory_bytes > 16 * GIB
    assert (c.fp32_tflops is None) == (card == "A10G")  # AWS's part: no FP32 figure to cite
    slices = [o for o in SHIPPED.offers if o.card == card and o.mig]
    has_mig = card not in ("A10", "A10G", "L40")
    assert bool(slices) == has_mig
    for s in slices:
        assert s.memory_bytes < c.memory_bytes and s.nvlink_gbps_each_way == 0 and s.of_slices == c.of_slices
        assert s.fp16_tflops == pytest.approx(c.fp16_tflops * s.slices / c.of_slices)
    assert (c.nvlink_gbps_each_way > 0) == (card in ("H200", "B200", "GB200", "H20", "A30"))


def test_an_a30s_slice_is_a_quarter_not_a_seventh() -> None:
    """The A30 has 4 compute slices: its 1g.6gb has a quarter of its compute and costs a quarter."""
    s = next(o for o in SHIPPED.offers if o.name == "A30 MIG 1g.6gb")
    assert (s.share, s.fp16_tflops, s.fp64_tflops) == (0.25, 165 / 4, 5.2 / 4)
    assert next(o for o in SHIPPED.offers if o.name == "A30 MIG 4g.24gb").whole_card
