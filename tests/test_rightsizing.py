"""Right-sizing: what a GPU is told to do (release it, reclaim it, move its job to a cheaper card or
MIG slice), when it is told nothing, and what the advice says: never a card that is slower, smaller
than what the job used, the same card, unpriced, or priced only by an example.

Each expected figure is worked out by hand in the comments from the shipped catalogue's figures
(dense FP16/BF16 tensor TFLOPS with FP32 accumulate): a job needs its highest memory use x 1.2, its
p95 activity while held x its card's TFLOPS, and where known its p95 DRAM activity x its card's
bandwidth; a month is 730 h.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.report.catalogue import PIPES, Catalogue, CatalogueError, load_catalogue
from gpu_exporter.report.command import main
from gpu_exporter.report.prices import CATALOGUE, PRICING, STORE, Price, PriceList
from gpu_exporter.report.rightsizing import CARD, MIG, OWN_PRICE, RECLAIM, RELEASE, SLOWER, Sizer, Usage
from tests import assert_mentions

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
A100_40 = "NVIDIA A100-PCIE-40GB"
L4 = "NVIDIA L4"
SHIPPED = load_catalogue()
ROOT = Path(__file__).resolve().parent.parent


def usage(model: str | None, peak_gib: float | None, activity: float | None, *, price: float | None,
          total_gib: float = 80.0, busy: float = 100.0, alloc: float = 0.0, idle: float = 0.0, down: float = 0.0,
          **kw: Any) -> Usage:  # fmt: skip
    """A GPU with GPM: its SM activity, and unless a test says otherwise, pipes and DRAM it barely used
    and no NVLink traffic (the tests of what is unknown or used say so)."""
    known: dict[str, Any] = {"pipes": dict.fromkeys(PIPES, 0.0), "dram_p95": 0.0, "nvlink_bytes_per_second": 0.0}
    return Usage(node="gpu-7", gpu="3", uuid="GPU-7-3", model=model, holder="pod ml/tune-c",
                 idle_holder="pod ml/tune-c" if alloc else "", busy_hours=busy, allocated_idle_hours=alloc,
                 idle_hours=idle, down_hours=down, price_per_hour=price, memory_total_bytes=total_gib * GIB,
                 memory_peak_bytes=None if peak_gib is None else peak_gib * GIB, activity_p95=activity,
                 activity_signal="SM activity", **(known | kw))  # fmt: skip


def sizer(fleet: dict[str, float] | None = None, currency: str = "USD", *, catalogue: Catalogue = SHIPPED,
          pricing: PricingSettings | None = None, **kw: Any) -> Sizer:  # fmt: skip
    """``fleet``: what the store says the fleet pays now per card."""
    return Sizer(catalogue, PriceList(catalogue, currency, fleet or {}, pricing), **kw)


# A fleet that prices every card the shipped catalogue knows, consumer cards too, cheaply: the cards
# the old advice chose (issue 25) are all there to be chosen, at prices that would save.
EVERYTHING = {"T4": 0.35, "V100 SXM2 32GB": 0.90, "A100 40GB": 1.30, "A100 80GB": 1.80, "RTX 3090": 0.30,
              "RTX 4090": 0.45, "L4": 0.50, "L40S": 1.00, "RTX 6000 Ada": 0.90, "H100 80GB": 2.50}  # fmt: skip


# -- 1. never a slower card for a busy job --------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "activity", "price"),
    [(H100, 0.82, 2.50), (A100_80, 0.60, 1.80), (H100, 1.0, 2.50), (L4, 0.71, 0.50), (L4, 0.96, 0.50)],
    ids=["h100-at-82%", "a100-at-60%", "h100-busy-720-of-720-h", "l4-at-71%", "l4-at-96%"],
)  # fmt: skip
def test_a_busy_gpu_is_never_told_to_move_to_a_slower_card(model: str, activity: float, price: float) -> None:
    """Issue 25: an H100 at 82% SM activity was told "RTX 4090, taking about 2.4x as long", an A100 at
    60% "RTX 3090", L4s at 71-96% "RTX 3090". The H100's job needs 0.82 x 989.4 = 811 TFLOPS: no card but
    an H100 has it, so no advice. The A100's needs 0.60 x 312 = 187: the RTX 3090 has 71, the 4090 165;
    an H100's 2g.20gb slice (283 TFLOPS, 2/7 x 2.50 = 0.71) is cheaper and as fast: that it may be told. The L4 at 71%
    needs 86: the 3090 (71) and the T4 (65) are out; an H100 1g.10gb slice (141, 2.50 / 7) is in.
    Consumer cards allowed or not, whatever is suggested is at least as fast."""
    need = activity * SHIPPED.card_of(model).fp16_tflops  # type: ignore[union-attr]
    offers = {o.name: o for o in SHIPPED.offers}
    for allow_consumer in (False, True):
        a = sizer(EVERYTHING, allow_consumer=allow_consumer).advise(usage(model, 8, activity, price=price, busy=720))
        if "H100" in model:
            assert a is None
        elif a is not None:
            assert offers[a.suggested].fp16_tflops >= need and a.kind in (CARD, MIG) and a.slowdown == 1.0, a
            assert "RTX" not in a.suggested
    a100 = sizer(EVERYTHING).advise(usage(A100_80, 8, 0.60, price=1.80, busy=720))
    assert a100 is not None and a100.suggested == "H100 80GB MIG 2g.20gb"


def test_a_cheaper_slower_card_is_its_own_opt_in_answer_with_cost_and_time_side_by_side() -> None:
    """--allow-slower: the H100 at 82% (811 TFLOPS needed, 100 h busy) could run on an RTX 6000 Ada (364.2
    TFLOPS, 0.90 USD/h): 811 / 364.2 = 2.23x as long, 223 h at 0.90 = 200 USD for the work 250 USD buys
    on the H100 (2.50 x 100 h); the L40S (1.00 x 2.24) costs the work more. Shown with its time and cost,
    never with a monthly saving."""
    job = usage(H100, 10, 0.82, price=2.50)
    assert sizer(EVERYTHING).advise(job) is None  # not without asking
    a = sizer(EVERYTHING, allow_slower=True).advise(job)
    assert a is not None and (a.kind, a.suggested, a.saving_per_month) == (SLOWER, "RTX 6000 Ada", None)
    slowdown = 0.82 * 989.4 / 364.2
    assert a.slowdown == pytest.approx(slowdown) and a.suggested_price_per_hour == 0.90
    assert_mentions(a.reason, "no cheaper card is as fast", "RTX 6000 Ada", "slower", "100 h", "2.2x as long",
                    "223 h", "$0.90/h", "the store's gpu_price_per_hour", "$2.50/h", "$200", "$250")  # fmt: skip
    assert "/month" not in a.reason
    # Slower and dearer for the work than the card it is on: not even that.
    assert sizer({"L40S": 2.40}, allow_slower=True).advise(job) is None


def test_consumer_cards_are_suggested_only_on_request() -> None:
    """A light job (10 GiB, 5% of 989 = 49.5 TFLOPS) on an H100 at 2.50: the RTX 3090 (24 GiB, 71 TFLOPS,
    0.30) is the cheapest card that holds it, but NVIDIA's GeForce licence keeps it out of a data centre:
    the T4 (15 GiB, 65 TFLOPS, 0.35) unless --allow-consumer-cards."""
    job = usage(H100, 10, 0.05, price=2.50)
    a = sizer(EVERYTHING).advise(job)
    assert a is not None and (a.kind, a.suggested, a.suggested_price_per_hour) == (CARD, "T4", 0.35)
    b = sizer(EVERYTHING, allow_consumer=True).advise(job)
    assert b is not None and b.suggested == "RTX 3090" and b.saving_per_month == pytest.approx((2.50 - 0.30) * 730)


def test_memory_bound_work_needs_the_bandwidth_it_used() -> None:
    """A job at 15% SM activity (148 TFLOPS) but 40% DRAM bandwidth on an H100 (0.40 x 3,350 = 1,340 GB/s),
    24 GiB needed: the RTX 6000 Ada (364 TFLOPS, 960 GB/s, 0.90) and the L40S (864 GB/s) are too slow for
    its memory; the H100's 3g.40gb slice (424 TFLOPS, 3,350 x 39.5 / 79.65 = 1,661 GB/s, 3/7 x 2.50 =
    1.07) is not. At 20% DRAM (670 GB/s) the RTX 6000 Ada does it."""
    job = usage(H100, 20, 0.15, price=2.50, dram_p95=0.40)
    a = sizer(EVERYTHING).advise(job)
    assert a is not None and a.suggested == "H100 80GB MIG 3g.40gb"
    assert_mentions(a.reason, "15% SM activity", "40% DRAM bandwidth", "p95")
    b = sizer(EVERYTHING).advise(replace(job, dram_p95=0.20))
    assert b is not None and (b.suggested, b.suggested_price_per_hour) == ("RTX 6000 Ada", 0.90)


def test_the_catalogue_compares_cards_by_one_measure_with_a_source_for_each() -> None:
    """Issue 25: the RTX 3090's and 4090's figures were FP16-accumulate (142 and 330 TFLOPS), the A100's and
    H100's FP32-accumulate: the consumer cards looked twice as fast as they are. Every card now carries
    dense FP16/BF16 with FP32 accumulate, its memory bandwidth, where the figures come from, and no price."""
    cards = yaml.safe_load((ROOT / "gpu_exporter" / "report" / "catalogue.yaml").read_text())["cards"]
    fp16 = {c["name"]: c["fp16_tflops"] for c in cards}
    assert (fp16["T4"], fp16["A100 80GB"], fp16["RTX 3090"], fp16["RTX 4090"], fp16["L4"], fp16["L40S"],
            fp16["H100 80GB"], fp16["H100 PCIe"]) == (65, 312, 71, 165.2, 121, 362.05, 989.4, 756)  # fmt: skip
    for c in cards:
        assert "price_per_hour" not in c, c["name"]
        assert c["memory_bandwidth_gbps"] > 0 and str(c["fp16_tflops"]).rstrip("0").rstrip(".") in \
            c["source"].replace(",", ""), c["name"]  # fmt: skip
        assert "NVIDIA" in c["source"] and any(w in c["source"] for w in ("datasheet", "whitepaper",
                                                                           "specifications")), c["name"]  # fmt: skip
        # Each pipe's rate and the NVLink figure come with where they come from (issue 37).
        cited = f"{c['source']} {c.get('rates', '')}"
        for key, word in (("fp64_tflops", "FP64"), ("fp32_tflops", "FP32"), ("nvlink_gbps", "NVLink")):
            if key in c:
                assert word in cited and str(c[key]).rstrip("0").rstrip(".") in cited.replace(",", ""), (c["name"], key)
    assert {c["name"] for c in cards if c.get("consumer")} == {"RTX 3090", "RTX 4090"}
    assert SHIPPED.currency is None and all(o.price_per_hour is None for o in SHIPPED.offers)


def test_the_shipped_catalogue_knows_the_cards_of_the_issue_and_their_nvml_names() -> None:
    names = {o.name for o in SHIPPED.offers}
    assert {"T4", "V100 SXM2 16GB", "V100 PCIe 32GB", "A100 40GB", "A100 80GB", "A100 80GB PCIe", "RTX 3090",
            "RTX 4090", "L4", "L40S", "RTX 6000 Ada", "H100 80GB", "H100 PCIe"} <= names  # fmt: skip
    assert {"A100 40GB MIG 1g.5gb", "A100 80GB MIG 3g.40gb", "H100 80GB MIG 1g.10gb", "H100 80GB MIG 7g.80gb"} <= names
    names_of = {H100: "H100 80GB", "NVIDIA H100 PCIe": "H100 PCIe", A100_80: "A100 80GB",
                "NVIDIA A100 80GB PCIe": "A100 80GB PCIe", A100_40: "A100 40GB", "Tesla T4": "T4", L4: "L4",
                "NVIDIA L40S": "L40S", "Tesla V100-SXM2-16GB": "V100 SXM2 16GB",
                "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada", "NVIDIA GeForce RTX 4090": "RTX 4090"}  # fmt: skip
    for nvml, card in names_of.items():
        found = SHIPPED.card_of(nvml)
        assert found is not None and found.name == card, nvml


# -- 2. memory by the highest use -------------------------------------------------------------------------
def test_the_suggested_card_holds_the_highest_memory_the_job_used() -> None:
    """Issue 25: a GPU whose memory reached 70 GiB in 6 of 720 hours was sized by the p98 of its hourly
    peaks (12 GiB) and told of a 24 GiB card. Its need is 70 x 1.2 = 84 GiB: no card holds that."""
    assert sizer(EVERYTHING, allow_consumer=True).advise(usage(H100, 70, 0.05, price=2.50, busy=720)) is None
    # At 12 GiB it would have fitted the T4? No: 12 x 1.2 = 14.4 GiB in the T4's 15.
    a = sizer(EVERYTHING).advise(usage(H100, 12, 0.05, price=2.50))
    assert a is not None and a.suggested == "T4" and "with 25% headroom" in a.reason


def test_a_card_with_exactly_the_memory_the_job_needs_holds_it(tmp_path: Path) -> None:
    """The need is the highest use x 1.2: 10 GiB fits a 12 GiB card exactly; a byte more does not."""
    cat = two_cards(tmp_path, small_price=1.00, small_memory=12)
    a = sizer({"Big": 3.00}, catalogue=cat).advise(usage("Big", 10, 0.5, price=3.00, total_gib=40))
    assert a is not None and a.suggested == "Small" and "with 20% headroom" in a.reason
    assert sizer({"Big": 3.00}, catalogue=cat).advise(usage("Big", 10 + 1 / GIB, 0.5, price=3.00, total_gib=40)) \
        is None  # fmt: skip


def test_a_job_that_never_touched_the_gpus_memory_gets_no_headroom_figure() -> None:
    """Held but never used (highest use 0, activity 0): any offer holds it; the headroom over 0 is no
    percentage, so the reason leaves it out rather than say 0%."""
    a = sizer({"H100 80GB": 2.50, "T4": 0.35}).advise(usage(H100, 0.0, 0.0, price=2.50))
    assert a is not None and a.suggested == "T4"  # 0.35, below the H100's 1g.10gb at 2.50 / 7 = 0.357
    assert "headroom" not in a.reason and "a T4 holds that and is at least as fast" in a.reason, a.reason


def test_a_peak_at_the_whole_card_gets_the_reservation_note_not_a_card(tmp_path: Path) -> None:
    cat = two_cards(tmp_path, small_price=0.50)
    s = sizer({"Big": 3.00}, catalogue=cat)
    whole = usage("Big", 40, 0.5, price=3.00, total_gib=40)
    assert s.advise(whole) is None
    (note,) = s.notes(whole)
    assert "whole card (40.0 of 40.0 GiB)" in note and "TF_FORCE_GPU_ALLOW_GROWTH=true" in note
    assert s.notes(replace(whole, memory_peak_bytes=0.95 * 40 * GIB))
    below = replace(whole, memory_peak_bytes=0.94 * 40 * GIB)
    assert s.notes(below) == [] and s.advise(below) is not None


# -- 3. never the same card ----------------------------------------------------------------------------------
def test_a_gpu_is_never_told_to_move_to_its_own_card_or_all_of_it_as_one_slice() -> None:
    """Issue 25: with one H100 reserved at 2.00 and one on demand at 3.00, the dearer was told "H100 80GB
    MIG 7g.80gb, saves about $730/month": that slice is the whole card. A job of 60 GiB (72 needed) fits
    only a whole H100 or its 7g.80gb: nothing. A 30 GiB job (36 needed) fits 3g.40gb, its own slice at
    its own price: 3/7 x 3.00 = 1.29."""
    fleet = {"H100 80GB": 3.00}  # the highest H100 price: the store's figure for the card
    assert sizer(fleet).advise(usage(H100, 60, 0.05, price=3.00)) is None
    assert sizer(fleet).advise(usage(H100, 60, 0.05, price=2.00)) is None
    a = sizer(fleet).advise(usage(H100, 30, 0.20, price=3.00))
    assert a is not None and (a.kind, a.suggested, a.price_source) == (MIG, "H100 80GB MIG 3g.40gb", OWN_PRICE)
    assert a.suggested_price_per_hour == pytest.approx(3.00 * 3 / 7)
    assert a.saving_per_month == pytest.approx(3.00 * 4 / 7 * 730)


def test_never_a_card_at_the_same_or_a_higher_price(tmp_path: Path) -> None:
    def advised(small: float, now: float) -> bool:
        s = sizer({"Big": 3.00}, catalogue=two_cards(tmp_path, small_price=small), min_saving_ratio=0)
        return s.advise(usage("Big", 10, 0.5, price=now, total_gib=40)) is not None

    assert not advised(3.00, 3.00) and not advised(3.00, 2.90) and advised(2.99, 3.00)


# -- only priced cards -----------------------------------------------------------------------------------------
def test_a_card_is_suggested_only_at_a_price_the_user_gave() -> None:
    """The shipped catalogue has no prices: with only the H100's own price in the store, the one thing to
    suggest is a slice of it. Nothing priced, nothing suggested."""
    job = usage(H100, 10, 0.05, price=2.50)
    a = sizer({"H100 80GB": 2.50}).advise(job)
    assert a is not None and a.suggested == "H100 80GB MIG 1g.20gb"  # 12 GiB needed: more than 1g.10gb's 9.75
    assert sizer({}).advise(replace(job, price_per_hour=None)) is None


def test_prices_come_from_the_users_catalogue_then_the_pricing_settings_then_the_store(tmp_path: Path) -> None:
    """A card's price: a price_per_hour in the user's catalogue (in its currency), else a key of the
    pricing section that names it as a word ("L4" prices the L4, not the L40S), else what the store says
    the fleet pays for it. A pricing default prices no card."""
    pricing = PricingSettings(currency="USD", models={"L4": 0.60, "A100": 1.40}, default=0.01)
    prices = PriceList(SHIPPED, "USD", {"L4": 0.55, "L40S": 1.10}, pricing)
    assert prices.card("L4") == Price(0.60, PRICING) and prices.card("L40S") == Price(1.10, STORE)
    assert prices.card("A100 80GB PCIe") == Price(1.40, PRICING)
    assert prices.card("T4") is None  # the default is no price for a card
    assert PriceList(SHIPPED, "EUR", {}, pricing).card("L4") is None  # the pricing section is in USD
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"currency": "usd", "cards": [
        {"name": "L4", "match": ["L4"], "memory_gib": 22.5, "fp16_tflops": 121, "memory_bandwidth_gbps": 300,
         "price_per_hour": 0.40}]}))  # fmt: skip
    own = PriceList(load_catalogue(mine), "USD", {"L4": 0.55}, pricing).card("L4")
    assert own is not None and (own.per_hour, own.source) == (0.40, CATALOGUE)
    assert PriceList(load_catalogue(mine), "EUR", {"L4": 0.55}).card("L4") == Price(0.55, STORE)


# -- 4. release and reclaim, from the time the exporter saw ------------------------------------------------
def test_a_gpu_idle_for_all_the_time_the_exporter_saw_it_is_released() -> None:
    """Issue 25: an L4 idle for 100% of its observed life, 94.7% of the range (the exporter started late),
    got nothing. Seen 159.1 h, idle all of it: released, saving 0.80 x 730 a month."""
    u = usage(L4, 0, None, price=0.80, busy=0, idle=159.1, total_gib=22.5)
    a = sizer().advise(u)
    assert a is not None and (a.kind, a.suggested) == (RELEASE, "release")
    assert a.saving_per_month == pytest.approx(0.80 * 730)
    assert_mentions(a.reason, "GPU 3 on gpu-7", L4, "idle", "held by nobody", "159 h", "the exporter saw it", "100%",
                    "$127", "releasing it", "$584/month")  # fmt: skip


@pytest.mark.parametrize(("idle", "busy", "released"), [(90, 10, True), (89.9, 10.1, False), (45, 5, True)])
def test_release_needs_nine_tenths_of_the_time_up_idle_and_unheld(idle: float, busy: float, released: bool) -> None:
    """Down time is neither use nor waste: 45 h idle and 5 h busy of 50 h up (and 50 h down) is 90%."""
    down = 100 - idle - busy
    a = sizer().advise(usage(H100, 1, 0.5, price=3.00, busy=busy, idle=idle, down=down))
    assert (a is not None and a.kind == RELEASE) is released
    if released:
        assert a is not None and a.saving_per_month == pytest.approx(3.00 * idle / 100 * 730)


def test_a_gpu_held_but_idle_is_reclaimed_from_its_holder_with_its_cost() -> None:
    """Issue 25: an H100 held at 0% for the whole range was told "A100 MIG 3g.40gb" rather than "reclaim it".
    Held 168 h, idle all of it, at 3.00: 504 USD wasted, 2,190 a month."""
    u = usage(H100, 30, 0.0, price=3.00, busy=0, alloc=168)
    a = sizer(EVERYTHING).advise(u)
    assert a is not None and (a.kind, a.suggested) == (RECLAIM, "reclaim from pod ml/tune-c")
    assert a.saving_per_month == pytest.approx(3.00 * 730)
    assert_mentions(a.reason, "GPU 3 on gpu-7", H100, "held but left idle", "168 h", "100%", "$504",
                    "reclaiming it from pod ml/tune-c", "$2,190/month")  # fmt: skip


@pytest.mark.parametrize(("alloc", "busy", "kind"), [(50, 50, RECLAIM), (49.9, 50.1, None), (100, 0, RECLAIM)])
def test_reclaim_needs_half_the_time_held_idle(alloc: float, busy: float, kind: str | None) -> None:
    a = sizer().advise(usage(H100, 79, 0.9, price=3.00, busy=busy, alloc=alloc))  # too big and busy to resize
    assert (a.kind if a else None) == kind


def test_release_and_reclaim_need_no_catalogue_card_and_happen_in_mig_mode_too() -> None:
    """A card the catalogue does not know, or one in MIG mode, is still idle: released. Sizing it is
    another matter (no figures; slices sized by someone)."""
    unknown = usage("NVIDIA GeForce GT 710", 0.1, 0.01, price=0.10, busy=0, idle=100, total_gib=2)
    assert sizer().advise(unknown).kind == RELEASE  # type: ignore[union-attr]
    assert sizer().advise(replace(unknown, mig_mode=True, model=A100_80)).kind == RELEASE  # type: ignore[union-attr]
    light = usage(A100_80, 6.5, 0.04, price=1.75)
    assert sizer({"A100 80GB": 1.75}).advise(light) is not None
    assert sizer({"A100 80GB": 1.75}).advise(replace(light, mig_mode=True)) is None


def test_on_a_fleet_like_issue_25s_the_advice_covers_most_of_the_waste() -> None:
    """The 30-day fleet: allocated-idle H100s (reclaim), idle RTX 6000s (release), and GPUs idle over 90% of
    the time with a little use (release, where the old rule wanted 95% of the range). Each of these
    wastes what the advice saves: the advised savings are the waste's cost, a month."""
    gpus = [usage(H100, 40, 0.01, price=2.50, busy=10, alloc=700, idle=10),
            usage("NVIDIA RTX 6000 Ada Generation", 0, None, price=0.80, busy=0, idle=690, down=30, total_gib=48),
            usage(H100, 40, 0.3, price=2.50, busy=33.3, idle=686.7)]  # fmt: skip
    waste = sum((u.allocated_idle_hours + u.idle_hours) * (u.price_per_hour or 0) for u in gpus) / 720 * 730
    advised = [sizer().advise(u) for u in gpus]
    assert [a.kind for a in advised if a] == [RECLAIM, RELEASE, RELEASE]
    assert sum(a.saving_per_month or 0 for a in advised if a) >= 0.95 * waste


# -- 5. no monthly figure from minutes ---------------------------------------------------------------------
def test_a_monthly_saving_needs_a_day_of_history() -> None:
    """Issue 25: "$1,627/month" came from 5 minutes of data. Below --min-history (24 h) the advice is
    given, says what it saw, and has no monthly figure; at 24 h it has."""
    job = usage(H100, 10, 0.05, price=2.50, busy=5 / 60)
    a = sizer({"H100 80GB": 2.50}).advise(job)
    assert a is not None and a.saving_per_month is None and a.suggested == "H100 80GB MIG 1g.20gb"
    assert_mentions(a.reason, "would pay off", "only 5 min", "24 h of history")
    assert "/month" not in a.reason
    b = sizer({"H100 80GB": 2.50}).advise(replace(job, busy_hours=24))
    assert b is not None and b.saving_per_month == pytest.approx(2.50 * 6 / 7 * 730)
    short = sizer({"H100 80GB": 2.50}, min_history_hours=1 / 60).advise(job)
    assert short is not None and short.saving_per_month is not None
    idle = sizer().advise(usage(L4, 0, None, price=0.80, busy=0, idle=0.5))
    assert idle is not None and idle.saving_per_month is None and "saw it for only 30 min" in idle.reason


def test_a_gpu_without_a_price_gets_advice_without_a_figure() -> None:
    """Issue 25: an unpriced node's GPU was told "saves $146/month". Released or reclaimed, it says so
    with no money; no card is suggested (nothing to compare its price with)."""
    a = sizer(EVERYTHING).advise(usage(L4, 0, None, price=None, busy=0, idle=100))
    assert a is not None and a.kind == RELEASE and a.saving_per_month is None
    assert_mentions(a.reason, "releasing it", "no price")
    assert "which cost" not in a.reason and "$" not in a.reason
    assert sizer(EVERYTHING).advise(usage(H100, 10, 0.05, price=None)) is None


# -- thresholds and ties ------------------------------------------------------------------------------------
def two_cards(tmp_path: Path, small_price: float, big_price: float = 3.00, small_memory: float = 48) -> Catalogue:
    """A user's catalogue: the card the job is on, and a roomier, faster card at ``small_price``."""
    doc = {"currency": "USD", "cards": [
        {"name": "Big", "match": ["Big"], "memory_gib": 40, "fp16_tflops": 300, "memory_bandwidth_gbps": 1000,
         "price_per_hour": big_price},
        {"name": "Small", "match": ["Small"], "memory_gib": small_memory, "fp16_tflops": 400,
         "memory_bandwidth_gbps": 1000, "price_per_hour": small_price},
    ]}  # fmt: skip
    path = tmp_path / f"cards-{big_price}-{small_price}-{small_memory}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_catalogue(path)


@pytest.mark.parametrize(
    ("big_price", "small_price", "advised"),
    [(3.00, 2.39, True), (3.00, 2.41, False), (1.25, 1.00, True), (3.00, 2.40, True), (4.00, 3.20, True)],
    ids=["just-over-20%", "just-under-20%", "exactly-20%", "exactly-20%-float-above", "exactly-20%-float-below"],
)  # fmt: skip
def test_a_saving_of_at_least_a_fifth_is_advised(tmp_path: Path, big_price: float, small_price: float,
                                                 advised: bool) -> None:  # fmt: skip
    cat = two_cards(tmp_path, small_price, big_price)
    a = sizer(catalogue=cat).advise(usage("Big", 10, 0.5, price=big_price, total_gib=40))
    assert (a is not None) is advised
    if a is not None:
        assert (a.suggested, a.price_source) == ("Small", CATALOGUE)
        assert a.saving_per_month == pytest.approx((big_price - small_price) * 730)


def test_min_saving_is_at_least_that_much_a_month(tmp_path: Path) -> None:
    cat = two_cards(tmp_path, 2.40)  # (3.00 - 2.40) x 730 = 438 a month
    job = usage("Big", 10, 0.5, price=3.00, total_gib=40)
    assert sizer(catalogue=cat, min_saving=438.0).advise(job) is not None
    assert sizer(catalogue=cat, min_saving=438.01).advise(job) is None
    assert sizer(catalogue=cat, min_saving_ratio=0.5).advise(job) is None
    # Without a monthly figure, --min-saving cannot be judged: only the share.
    short = replace(job, busy_hours=2)
    assert sizer(catalogue=cat, min_saving=1e9).advise(short) is not None
    assert sizer(catalogue=cat, min_saving_ratio=0.5).advise(short) is None


def test_the_cheapest_that_is_as_fast_wins_then_the_least_memory() -> None:
    """3 GiB and 10% of an H100 (99 TFLOPS), H100 at 2.80 EUR: its 1g.10gb and 1g.20gb (141 TFLOPS) both
    hold it at 2.80 / 7 = 0.40 EUR/h; the smaller memory wins."""
    a = sizer({"H100 80GB": 2.80}, "EUR").advise(usage(H100, 3, 0.10, price=2.80))
    assert a is not None and a.suggested == "H100 80GB MIG 1g.10gb" and "€1,752/month" in a.reason
    # 40% (396 TFLOPS): 1g and 2g are too slow; 3g.40gb (424) is as fast, at 1.20.
    b = sizer({"H100 80GB": 2.80}, "EUR").advise(usage(H100, 3, 0.40, price=2.80))
    assert b is not None and b.suggested == "H100 80GB MIG 3g.40gb" and b.suggested_price_per_hour == pytest.approx(1.2)


def test_the_reason_carries_the_numbers() -> None:
    """6.5 GiB x 1.2 = 7.8 GiB in the A100 80GB's 1g.10gb (9.5 GiB, 44.6 TFLOPS >= 4% of 312): 46% headroom,
    1.80 / 7 = 0.26 USD/h against 1.80; (1.80 - 0.257) x 730 = 1,126 a month."""
    a = sizer({"A100 80GB": 1.80}).advise(usage(A100_80, 6.5, 0.04, price=1.80))
    assert a is not None
    assert_mentions(a.reason, "pod ml/tune-c", "6.5 GiB", "4% SM activity", "p95", A100_80, "GPU 3 on gpu-7", "100 h",
                    "A100 80GB MIG 1g.10gb", "46% headroom", "at least as fast", "$0.26/h", "this GPU's price",
                    "$1.80/h", "$1,126/month")  # fmt: skip


def test_a_gpu_without_a_model_a_memory_peak_or_an_activity_gets_no_card() -> None:
    light = usage(A100_80, 6.5, 0.04, price=1.80)
    s = sizer({"A100 80GB": 1.80})
    assert s.advise(light) is not None
    assert s.advise(replace(light, model=None)) is None
    assert s.advise(replace(light, memory_peak_bytes=None)) is None
    assert s.advise(replace(light, activity_p95=None)) is None
    assert s.advise(replace(light, busy_hours=0, idle_hours=0, down_hours=10)) is None  # never up


# -- the catalogue file -----------------------------------------------------------------------------------
CARD_DOC = {"name": "X1", "match": ["X1"], "memory_gib": 16, "fp16_tflops": 100, "memory_bandwidth_gbps": 300,
            "price_per_hour": 0.5}  # fmt: skip


def with_card(**changes: Any) -> str:
    card = {k: v for k, v in {**CARD_DOC, **changes}.items() if v is not None}
    return yaml.safe_dump({"currency": "USD", "cards": [card]})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("currency: USD\ncards: [broken\n", "is not valid YAML at line 3, column 1: expected ',' or ']'"),
        (with_card(memory_bandwidth_gbps=None), "cards[0] (X1): memory_bandwidth_gbps: missing"),
        (with_card(price_per_hour=-0.5), "cards[0] (X1): price_per_hour: Input should be greater than or equal to 0 "
                                         "(got -0.5)"),
        (with_card(price_per_hour=float("inf")), "cards[0] (X1): price_per_hour: Input should be a finite number"),
        (with_card(memory_gib="sixteen"), "cards[0] (X1): memory_gib: Input should be a valid number"),
        (with_card(memory_gib=0), "cards[0] (X1): memory_gib: Input should be greater than 0 (got 0)"),
        (with_card(match=["X1("]), "cards[0] (X1): match: match 'X1(' is not a regular expression"),
        (with_card(mig=[{"profile": "1g.5gb", "slices": 9, "memory_gib": 5}]),
         "cards[0] (X1): mig[0].slices: Input should be less than or equal to 7 (got 9)"),
        (with_card(colour="red"), "cards[0] (X1): colour: unknown key"),
        (with_card(consumer="maybe"), "cards[0] (X1): consumer: Input should be a valid boolean"),
        ("currency: USD\ncards: []\n", "cards: List should have at least 1 item"),
        ("", "expected a mapping with 'currency' and 'cards', got nothing"),
        ("- T4\n- L4\n", "expected a mapping with 'currency' and 'cards', got a list"),
        (yaml.safe_dump({"cards": [CARD_DOC, CARD_DOC]}), "cards ['X1'] are listed twice"),
    ],
    ids=["bad-yaml", "missing-field", "negative-price", "infinite-price", "wrong-type", "zero-memory", "bad-regex",
         "too-many-slices", "unknown-key", "bad-consumer", "no-cards", "empty-file", "a-list", "twice"],
)  # fmt: skip
def test_a_malformed_catalogue_exits_2_naming_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = tmp_path / "my-cards.yaml"
    path.write_text(text)
    with pytest.raises(CatalogueError):
        load_catalogue(path)
    # Checked before any query: no Prometheus is needed to be told the file is wrong.
    assert main(["--prometheus.url", "http://127.0.0.1:9", "--catalogue", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"gpu-exporter report: catalogue {path}") and problem in out.err, out.err


def test_an_older_catalogue_with_fp32_figures_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(with_card(fp32_tflops=10))
    assert load_catalogue(path).offers[0].fp16_tflops == 100


def test_an_unreadable_catalogue_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, problem in ((tmp_path / "missing.yaml", "No such file"), (tmp_path, "Is a directory")):
        assert main(["--prometheus.url", "http://127.0.0.1:9", "--catalogue", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"cannot read the catalogue {path}: {problem}" in err, err


def test_a_card_is_offered_whole_never_as_its_full_card_slice() -> None:
    """A 60 GiB job at 30% of an H100 (297 TFLOPS) fits an A100 80GB (312 TFLOPS) priced at 1.00: the card,
    not "A100 80GB MIG 7g.80gb", which is the same card at the same price with a reconfiguration."""
    a = sizer({"A100 80GB": 1.00}).advise(usage(H100, 60, 0.30, price=3.00))
    assert a is not None and (a.kind, a.suggested) == (CARD, "A100 80GB")


# -- the words and fields of each kind of advice (what a report reader and a script read) ---------------------
def test_release_and_reclaim_suggest_a_price_of_nothing_and_say_whose_gpu_it_is() -> None:
    release = sizer().advise(usage(None, 0, None, price=0.80, busy=0, idle=100))
    assert release is not None and (release.suggested_price_per_hour, release.slowdown, release.price_source) == \
        (0.0, 1.0, None)  # fmt: skip
    assert_mentions(release.reason, "GPU 3 on gpu-7", "model unknown", "held by nobody", "100 h")
    reclaim = sizer().advise(replace(usage(H100, 1, 0.0, price=3.00, busy=0, alloc=100), idle_holder=""))
    assert reclaim is not None and reclaim.suggested_price_per_hour == 0.0
    assert reclaim.suggested == "reclaim from an unattributed process"
    assert_mentions(reclaim.reason, "reclaiming it from an unattributed process", "$2,190/month")


def test_a_reclaim_without_a_day_of_history_or_a_price_says_which() -> None:
    short = sizer().advise(usage(H100, 1, 0.0, price=3.00, busy=0, alloc=2))
    assert short is not None and short.saving_per_month is None
    assert_mentions(short.reason, "GPU 3 on gpu-7", H100, "held but left idle", "2.0 h", "100%", "$6.00",
                    "reclaiming it from pod ml/tune-c", "only 2.0 h", "24 h of history")  # fmt: skip
    assert "/month" not in short.reason
    free = sizer().advise(usage(H100, 1, 0.0, price=None, busy=0, alloc=100))
    assert free is not None
    assert_mentions(free.reason, "GPU 3 on gpu-7", H100, "held but left idle", "100 h", "100%",
                    "reclaiming it from pod ml/tune-c", "no price")  # fmt: skip
    assert "$" not in free.reason
    unpriced = sizer().advise(usage(L4, 0, None, price=None, busy=0, idle=100))
    assert unpriced is not None
    assert_mentions(unpriced.reason, "GPU 3 on gpu-7", L4, "held by nobody", "100 h", "100%", "releasing it",
                    "no price")  # fmt: skip
    assert "$" not in unpriced.reason


def test_a_gpu_priced_at_nothing_has_nothing_to_save() -> None:
    """Owned hardware priced at 0: released or reclaimed, with no money figure (nothing is saved), and
    never told of a cheaper card (none is)."""
    a = sizer().advise(usage(L4, 0, None, price=0.0, busy=0, idle=100))
    assert a is not None and a.saving_per_month is None and "which cost" not in a.reason
    assert sizer(EVERYTHING).advise(usage(H100, 10, 0.05, price=0.0)) is None


def test_the_monthly_thresholds_weigh_release_and_reclaim_too() -> None:
    idle = usage(L4, 0, None, price=0.80, busy=0, idle=100)  # 584 a month
    assert sizer(min_saving=584.0).advise(idle) is not None and sizer(min_saving=585.0).advise(idle) is None
    cents = usage(L4, 0, None, price=0.001, busy=0, idle=100)  # 0.73 a month: under one unit, still said
    a = Sizer(SHIPPED, PriceList(SHIPPED, "USD", {})).advise(cents)
    assert a is not None and a.saving_per_month == pytest.approx(0.73) and "$0.73/month" in a.reason


def test_an_unattributed_jobs_sizing_says_so_with_its_figures() -> None:
    a = sizer({"H100 80GB": 2.80}).advise(replace(usage(H100, 3, 0.07, price=2.80, dram_p95=0.07), holder=""))
    assert a is not None and a.reason.startswith("an unattributed process")
    assert_mentions(a.reason, "3.0 GiB", "7% SM activity", "7% DRAM bandwidth", "p95")


def test_a_card_exactly_as_fast_as_the_job_needs_is_as_fast(tmp_path: Path) -> None:
    """50% of Big's 300 TFLOPS is 150: a card of 150 TFLOPS does it at the same speed, not slower."""
    doc = {"currency": "USD", "cards": [
        {"name": "Big", "match": ["Big"], "memory_gib": 40, "fp16_tflops": 300, "memory_bandwidth_gbps": 1000,
         "price_per_hour": 3.0},
        {"name": "Exact", "match": ["Exact"], "memory_gib": 40, "fp16_tflops": 150, "memory_bandwidth_gbps": 500,
         "price_per_hour": 1.0}]}  # fmt: skip
    path = tmp_path / "exact.yaml"
    path.write_text(yaml.safe_dump(doc))
    a = sizer(catalogue=load_catalogue(path)).advise(usage("Big", 10, 0.5, price=3.0, total_gib=40, dram_p95=0.5))
    assert a is not None and (a.kind, a.suggested, a.slowdown) == (CARD, "Exact", 1.0)


def slow_cards(tmp_path: Path, *cards: tuple[str, float, float, float]) -> Catalogue:
    """A user's catalogue: Big (the job's card, 300 TFLOPS, 3.00) and (name, TFLOPS, price, memory GiB) each."""
    doc = {"currency": "USD", "cards": [
        {"name": "Big", "match": ["Big"], "memory_gib": 40, "fp16_tflops": 300, "memory_bandwidth_gbps": 1000,
         "price_per_hour": 3.0},
        *({"name": n, "match": [n], "memory_gib": m, "fp16_tflops": t, "memory_bandwidth_gbps": 1000,
           "price_per_hour": p} for n, t, p, m in cards)]}  # fmt: skip
    path = tmp_path / f"slow-{len(cards)}-{cards[0][0]}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_catalogue(path)


def test_a_slower_card_is_chosen_by_the_cost_of_the_work_to_the_cent(tmp_path: Path) -> None:
    """The job needs 150 TFLOPS. Half (75 TFLOPS, 0.60): twice as long, 1.20 an hour of work. Third (50
    TFLOPS, 0.45, less memory): three times, 1.35. The cheaper work wins, however close."""
    cat = slow_cards(tmp_path, ("Half", 75, 0.60, 40), ("Third", 50, 0.45, 30))
    job = usage("Big", 10, 0.5, price=3.0, total_gib=40, busy=80, alloc=20)
    a = sizer(catalogue=cat, allow_slower=True).advise(job)
    assert a is not None and (a.kind, a.suggested, a.slowdown, a.price_source) == (SLOWER, "Half", 2.0, CATALOGUE)
    # The work is the busy hours (80), not the held ones (100).
    assert_mentions(a.reason, "80 h", "2.0x as long", "160 h", "$0.60/h", "your catalogue", "$3.00/h", "$96.00",
                    "$240")  # fmt: skip
    assert "$300" not in a.reason and "$120" not in a.reason  # not what the held hours cost


def test_a_slower_card_that_costs_the_work_as_much_is_no_advice(tmp_path: Path) -> None:
    cat = slow_cards(tmp_path, ("Half", 75, 1.50, 40))  # twice as long at half the price: 3.00 for the work
    assert sizer(catalogue=cat, allow_slower=True).advise(usage("Big", 10, 0.5, price=3.0, total_gib=40)) is None


def test_a_dearer_card_as_fast_does_not_hide_a_cheaper_slower_one(tmp_path: Path) -> None:
    """Fast (300 TFLOPS) costs more than Big; Half (75, 0.60) is cheaper but slower: with --allow-slower,
    Half, as its own answer; the dearer card is never advice."""
    cat = slow_cards(tmp_path, ("Fast", 300, 3.5, 40), ("Half", 75, 0.60, 40))
    job = usage("Big", 10, 0.5, price=3.0, total_gib=40)
    assert sizer(catalogue=cat).advise(job) is None
    a = sizer(catalogue=cat, allow_slower=True).advise(job)
    assert a is not None and (a.kind, a.suggested) == (SLOWER, "Half")


def test_the_advice_shows_activity_and_bandwidth_as_measured() -> None:
    a = sizer({"H100 80GB": 2.80}).advise(usage(H100, 3, 0.07, price=2.80, dram_p95=0.07))
    assert a is not None
    assert_mentions(a.reason, "3.0 GiB", "7% SM activity", "7% DRAM bandwidth", "p95")


def test_the_longest_pricing_key_names_a_card_whatever_its_case(tmp_path: Path) -> None:
    """Keys match as the daemon's do, longest first and whatever their case: "x100 max" prices the X100
    Max, though "X100" is part of its name (and sorts first by name); "X100" prices the X100. A card the
    catalogue does not list has no catalogue price, only the store's."""
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"cards": [
        {"name": n, "match": [n], "memory_gib": 16, "fp16_tflops": 100, "memory_bandwidth_gbps": 300}
        for n in ("X100", "X100 Max")]}))  # fmt: skip
    pricing = PricingSettings(currency="USD", models={"X100": 1.0, "x100 max": 2.0})
    prices = PriceList(load_catalogue(path), "USD", {"Elsewhere": 0.5}, pricing)
    assert prices.card("X100 Max") == Price(2.0, PRICING) and prices.card("X100") == Price(1.0, PRICING)
    assert prices.card("Elsewhere") == Price(0.5, STORE) and prices.card("Nowhere") is None


def test_the_words_scale_with_the_hours() -> None:
    from gpu_exporter.report.rightsizing import hours_text

    assert [hours_text(h) for h in (10, 9.96, 1, 0.999, 1 / 60)] == ["10 h", "10.0 h", "1.0 h", "60 min", "1 min"]


def test_the_share_and_the_monthly_floor_weigh_release_and_reclaim() -> None:
    """Reclaiming 60 of 100 held hours is 60% of what the GPU costs: not at --min-saving-ratio 0.7.
    Released, 95 idle hours of 100 are 95%: not at 0.96. A monthly floor above the saving: neither."""
    reclaim = usage(H100, 1, 0.0, price=3.0, busy=40, alloc=60)
    assert sizer().advise(reclaim) is not None and sizer(min_saving_ratio=0.7).advise(reclaim) is None
    assert sizer(min_saving=3.0 * 0.6 * 730 + 1).advise(reclaim) is None
    release = usage(L4, 0, None, price=0.8, busy=5, idle=95)
    assert sizer(min_saving_ratio=0.94).advise(release) is not None
    assert sizer(min_saving_ratio=0.96).advise(release) is None
    # Held for half an hour and idle all of it: reclaimed, without a monthly figure.
    brief = sizer().advise(usage(H100, 1, 0.0, price=3.0, busy=0, alloc=0.5))
    assert brief is not None and brief.kind == RECLAIM and "for 30 min of the 30 min it was held" in brief.reason


def test_the_advice_shows_seventy_percent_as_seventy(tmp_path: Path) -> None:
    a = sizer(catalogue=two_cards(tmp_path, 1.0)).advise(usage("Big", 10, 0.7, price=3.0, total_gib=40, dram_p95=0.7))
    assert a is not None
    assert_mentions(a.reason, "70% SM activity", "70% DRAM bandwidth")
