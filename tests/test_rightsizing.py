"""Right-sizing on the shipped catalogue (and on users' catalogues): which card or MIG slice a
GPU's job is told it could run on, when it is told nothing, and what the advice says.

Each expected figure is worked out by hand in the comments from the catalogue's spec-sheet values:
a job needs its p98 memory peak x 1.2 and p95 activity x its card's FP16 TFLOPS; an offer costs its
price x max(1, needed TFLOPS / its TFLOPS); a month is 730 h of the use seen in the range.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.report.catalogue import Catalogue, CatalogueError, load_catalogue
from gpu_exporter.report.command import main
from gpu_exporter.report.rightsizing import Sizer, Usage

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
A100_40 = "NVIDIA A100-PCIE-40GB"
SHIPPED = load_catalogue()


def usage(model: str, peak_gib: float, activity: float, *, price: float | None, total_gib: float = 80.0,
          held: float = 100.0, range_hours: float = 100.0, **kw: Any) -> Usage:  # fmt: skip
    return Usage(node="gpu-7", gpu="3", uuid="GPU-7-3", model=model, holder="pod ml/tune-c", held_hours=held,
                 idle_hours=0.0, range_hours=range_hours, price_per_hour=price,
                 memory_total_bytes=total_gib * GIB, memory_peak_bytes=peak_gib * GIB, activity_p95=activity,
                 activity_signal="SM activity", **kw)  # fmt: skip


def fleet_only(card: str, price: float, currency: str = "EUR") -> Sizer:
    """A fleet that owns only ``card``, priced in a currency the catalogue's reference prices (USD)
    are not in: its own card's MIG slices are the only offers with a price."""
    return Sizer(SHIPPED, currency, {card: price})


def usd(fleet: dict[str, float] | None = None, **kw: Any) -> Sizer:
    return Sizer(SHIPPED, "USD", fleet or {}, **kw)


# -- MIG slices --------------------------------------------------------------------------------------
def test_a_light_job_on_an_a100_gets_its_smallest_mig_slice() -> None:
    # 6.5 GiB x 1.2 = 7.8 GiB; 4% of 312 = 12.5 TFLOPS. The A100 80GB's 1g.10gb (9.5 GiB, 312/7 = 44.6
    # TFLOPS) holds both, at the fleet's 1.75/7 = 0.25 USD/h: below the RTX 3090 (0.30), T4 (0.35), and
    # the H100's 1g.10gb (2.50/7 = 0.357).
    a = usd({"A100 80GB": 1.75}).advise(usage(A100_80, 6.5, 0.04, price=1.75, held=50))
    assert a is not None
    assert (a.suggested, a.suggested_price_per_hour, a.slowdown) == ("A100 80GB MIG 1g.10gb", 0.25, 1.0)
    # (1.75 - 0.25) x 50 h x 730 / 100 h.
    assert a.saving_per_month == pytest.approx(547.5)


def test_memory_picks_the_2g_slice_where_the_1g_is_too_small() -> None:
    # 7 GiB x 1.2 = 8.4 GiB: more than 1g.5gb (4.75), within 2g.10gb (9.75 GiB, 2 x 312/7 = 89 TFLOPS
    # >= 20% of 312 = 62.4). The fleet has only A100 40GBs at 1.40 EUR/h: 2 x 0.20 EUR/h.
    a = fleet_only("A100 40GB", 1.40).advise(usage(A100_40, 7, 0.20, price=1.40, total_gib=40))
    assert a is not None and (a.suggested, a.slowdown) == ("A100 40GB MIG 2g.10gb", 1.0)
    assert a.suggested_price_per_hour == pytest.approx(0.40)
    assert a.saving_per_month == pytest.approx((1.40 - 0.40) * 730)
    assert "estimated saving €730/month" in a.reason


def test_memory_picks_the_3g_slice_of_an_h100() -> None:
    # 20 GiB x 1.2 = 24 GiB: more than the 20 GB profiles (19.5), within 3g.40gb (39.5 GiB; 3 x 960/7 =
    # 411 TFLOPS >= 30% of 960 = 288) at 3/7 x 2.80 = 1.20 EUR/h; 4g.40gb holds it too, for 1.60.
    a = fleet_only("H100 80GB", 2.80).advise(usage(H100, 20, 0.30, price=2.80))
    assert a is not None and (a.suggested, a.slowdown) == ("H100 80GB MIG 3g.40gb", 1.0)
    assert a.suggested_price_per_hour == pytest.approx(1.20)


def test_of_two_slices_at_the_same_price_the_smaller_memory_wins() -> None:
    # 3 GiB, 10% of 960 = 96 TFLOPS: 1g.10gb and 1g.20gb both hold it at 2.80/7 = 0.40 EUR/h.
    a = fleet_only("H100 80GB", 2.80).advise(usage(H100, 3, 0.10, price=2.80))
    assert a is not None and a.suggested == "H100 80GB MIG 1g.10gb"


def test_at_the_same_cost_for_the_work_the_slice_that_slows_the_job_least_wins() -> None:
    # 3 GiB but 40% of 960 = 384 TFLOPS, 2.8 slices' worth. 1g.10gb: 0.40 EUR/h x 2.8 as long = 1.12;
    # 2g.20gb: 0.80 x 1.4 = 1.12; 3g.40gb (411 TFLOPS, fits): 1.20. The same cost for 1g and 2g: the
    # 2g, which takes half as long.
    a = fleet_only("H100 80GB", 2.80).advise(usage(H100, 3, 0.40, price=2.80))
    assert a is not None and a.suggested == "H100 80GB MIG 2g.20gb"
    assert a.slowdown == pytest.approx(1.4) and "taking about 1.4x as long" in a.reason
    assert a.saving_per_month == pytest.approx((2.80 - 1.12) * 730)


def test_a_gpu_in_mig_mode_gets_no_advice() -> None:
    """Its slices are already sized by someone; the report cannot see what each slice's job uses."""
    light = usage(A100_80, 6.5, 0.04, price=1.75)
    sizer = usd({"A100 80GB": 1.75})
    assert sizer.advise(light) is not None
    assert sizer.advise(replace(light, mig_mode=True)) is None
    idle = replace(light, held_hours=0.0, idle_hours=100.0)
    assert sizer.advise(idle) is not None and sizer.advise(idle).suggested == "release"  # type: ignore[union-attr]
    assert sizer.advise(replace(idle, mig_mode=True)) is None


# -- the smallest fitting card ------------------------------------------------------------------------
def test_the_cheapest_card_that_holds_the_job_is_chosen_not_any_that_does() -> None:
    # 17 GiB x 1.2 = 20.4 GiB, 5% of 960 = 48 TFLOPS. Hold it: RTX 3090 (24 GiB, 0.30 USD/h), RTX 4090
    # (0.45), L4 (22.5, 0.50), A100 80GB 3g.40gb (0.77), L40S (1.00), H100 3g.40gb (1.07), V100 32GB
    # (1.10), A100 40GB (1.30). Too small: T4 (15), V100 16GB, every 20 GB slice (19.5/19.62).
    a = usd({"H100 80GB": 2.50}).advise(usage(H100, 17, 0.05, price=2.50, held=168, range_hours=168))
    assert a is not None and (a.suggested, a.suggested_price_per_hour, a.slowdown) == ("RTX 3090", 0.30, 1.0)
    assert a.saving_per_month == pytest.approx((2.50 - 0.30) * 730)


def test_a_slower_card_is_priced_for_the_longer_time_it_takes() -> None:
    # 9 GiB x 1.2 = 10.8 GiB; 16% of 960 = 153.6 TFLOPS. RTX 3090: 142 TFLOPS, 153.6 / 142 = 1.0817x as
    # long, 0.30 x 1.0817 = 0.3245 USD/h; RTX 4090 (330 TFLOPS) 0.45; H100 1g.20gb (137 TFLOPS) 2.60/7 x
    # 1.12 = 0.416. Held 120 h of 240: (2.60 - 0.3245) x 120 x 730 / 240 = 830.55 USD/month.
    a = usd({"H100 80GB": 2.60}).advise(usage(H100, 9, 0.16, price=2.60, held=120, range_hours=240))
    assert a is not None and a.suggested == "RTX 3090"
    slowdown = 0.16 * 960 / 142
    assert a.slowdown == pytest.approx(slowdown)
    assert a.saving_per_month == pytest.approx((2.60 - 0.30 * slowdown) * 120 * 730 / 240)
    assert a.saving_per_month == pytest.approx(830.55, abs=0.01)
    assert a.reason == (
        "pod ml/tune-c peaked at 9.0 GiB and 16% SM activity on NVIDIA H100 80GB HBM3 (GPU 3 on gpu-7) for 120 h; "
        "an RTX 3090 would hold it with 167% headroom, taking about 1.1x as long; estimated saving $831/month"
    )


def test_a_job_bigger_than_every_smaller_card_gets_no_suggestion() -> None:
    # 70 GiB x 1.2 = 84 GiB: more than any card or slice in the catalogue but the H100's own 80.
    assert usd({"H100 80GB": 2.50}).advise(usage(H100, 70, 0.05, price=2.50)) is None
    # 35 GiB x 1.2 = 42 GiB: more than the H100's 40 GB slices; its 7g.80gb costs as much as the card.
    assert fleet_only("H100 80GB", 2.80).advise(usage(H100, 35, 0.05, price=2.80)) is None


def test_a_card_the_catalogue_does_not_know_gets_no_suggestion() -> None:
    assert usd().advise(usage("NVIDIA GeForce GT 710", 0.5, 0.01, price=0.10, total_gib=2)) is None


# -- the reason and the arithmetic --------------------------------------------------------------------
def test_the_reason_carries_the_numbers() -> None:
    # 6.5 GiB x 1.2 = 7.8 GiB in 1g.10gb's 9.5 GiB: 9.5 / 6.5 - 1 = 46% headroom. (1.75 - 0.25) x 50 h x
    # 730 / 100 h = 547.50, shown to the dollar.
    a = usd({"A100 80GB": 1.75}).advise(usage(A100_80, 6.5, 0.04, price=1.75, held=50))
    assert a is not None and a.reason == (
        "pod ml/tune-c peaked at 6.5 GiB and 4% SM activity on NVIDIA A100-SXM4-80GB (GPU 3 on gpu-7) for 50 h; "
        "an A100 80GB MIG 1g.10gb would hold it with 46% headroom; estimated saving $548/month"
    )


def test_short_ranges_and_small_savings_are_written_to_scale() -> None:
    # 30 minutes, all of it held: (1.75 - 0.25) x 0.5 h x 730 / 0.5 h = 1,095 a month; nobody's job.
    a = usd({"A100 80GB": 1.75}).advise(replace(usage(A100_80, 6.5, 0.04, price=1.75, held=0.5, range_hours=0.5),
                                                holder=""))  # fmt: skip
    assert a is not None and a.reason.startswith("an unattributed process peaked at 6.5 GiB")
    assert "for 30 min;" in a.reason and "estimated saving $1,095/month" in a.reason
    # 2.5 h of 1000 h: 1.5 x 2.5 x 0.73 = 2.7375 a month, in cents.
    b = usd({"A100 80GB": 1.75}).advise(usage(A100_80, 6.5, 0.04, price=1.75, held=2.5, range_hours=1000))
    assert b is not None and "for 2.5 h;" in b.reason and "estimated saving $2.74/month" in b.reason


# -- the saving threshold -----------------------------------------------------------------------------
def two_cards(tmp_path: Path, small_price: float, big_price: float = 3.00) -> Catalogue:
    """A user's catalogue: the card the job is on, and a roomier, faster card at ``small_price``."""
    doc = {"currency": "USD", "cards": [
        {"name": "Big", "match": ["Big"], "memory_gib": 40, "fp16_tflops": 300, "fp32_tflops": 30,
         "memory_bandwidth_gbps": 1000, "price_per_hour": big_price},
        {"name": "Small", "match": ["Small"], "memory_gib": 48, "fp16_tflops": 400, "fp32_tflops": 40,
         "memory_bandwidth_gbps": 1000, "price_per_hour": small_price},
    ]}  # fmt: skip
    path = tmp_path / f"cards-{big_price}-{small_price}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_catalogue(path)


def advise_on_big(catalogue: Catalogue, big_price: float = 3.00, **kw: Any) -> Any:
    job = usage("Big", 10, 0.5, price=big_price, total_gib=40)
    return Sizer(catalogue, "USD", {"Big": big_price}, **kw).advise(job)


@pytest.mark.parametrize(
    ("big_price", "small_price", "advised"),
    [(3.00, 2.39, True), (3.00, 2.41, False), (1.25, 1.00, True), (3.00, 2.40, True), (4.00, 3.20, True)],
    ids=["saves-just-over-20%", "saves-just-under-20%", "saves-exactly-20%", "exactly-20%-float-above",
         "exactly-20%-float-below"],
)  # fmt: skip
def test_a_saving_of_at_least_a_fifth_is_advised(
    tmp_path: Path, big_price: float, small_price: float, advised: bool
) -> None:
    """--min-saving-ratio (0.2) is "at least": 1.25 -> 1.00 saves exactly 20%, and is advised; so are
    3.00 -> 2.40 and 4.00 -> 3.20, which float arithmetic puts a hair above and below 20%."""
    a = advise_on_big(two_cards(tmp_path, small_price, big_price), big_price)
    assert (a is not None) is advised
    if a is not None:
        assert a.suggested == "Small" and a.saving_per_month == pytest.approx((big_price - small_price) * 730)


def test_min_saving_is_at_least_that_much_a_month(tmp_path: Path) -> None:
    cards = two_cards(tmp_path, 2.40)  # (3.00 - 2.40) x 730 = 438 a month
    exact = advise_on_big(cards).saving_per_month
    assert exact == pytest.approx(438.0)
    assert advise_on_big(cards, min_saving=exact) is not None
    assert advise_on_big(cards, min_saving=438.0) is not None
    assert advise_on_big(cards, min_saving=438.01) is None
    assert advise_on_big(cards, min_saving_ratio=0.5) is None  # 438 of 2,190 is 20%, not 50%
    # With both thresholds off, a card that saves nothing is still no suggestion.
    assert advise_on_big(two_cards(tmp_path, 3.00), min_saving_ratio=0.0) is None
    assert advise_on_big(two_cards(tmp_path, 2.99), min_saving_ratio=0.0) is not None


# -- frameworks that reserve the card ----------------------------------------------------------------
def test_a_peak_at_the_whole_card_gets_the_reservation_note_not_a_card(tmp_path: Path) -> None:
    sizer = Sizer(two_cards(tmp_path, 0.50), "USD", {"Big": 3.00})
    whole = usage("Big", 40, 0.5, price=3.00, total_gib=40)
    # Small's 48 GiB would hold 40 x 1.2: the peak is what frameworks reserve, not what the job needs.
    assert sizer.advise(whole) is None
    (note,) = sizer.notes(whole)
    assert "whole card (40.0 of 40.0 GiB)" in note and "reserve memory up front" in note
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in note and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in note
    # 95% of the card counts as all of it; below that the peak is taken as the job's.
    assert sizer.notes(replace(whole, memory_peak_bytes=0.95 * 40 * GIB))
    assert sizer.advise(replace(whole, memory_peak_bytes=0.95 * 40 * GIB)) is None
    below = replace(whole, memory_peak_bytes=0.94 * 40 * GIB)
    assert sizer.notes(below) == []
    a = sizer.advise(below)
    assert a is not None and a.suggested == "Small"


# -- the user's catalogue -----------------------------------------------------------------------------
def test_a_users_catalogue_replaces_the_shipped_one(tmp_path: Path) -> None:
    """A card the user adds, cheaper than any shipped, is the one suggested; the shipped cards the
    file leaves out are not offered."""
    doc = yaml.safe_load((Path(__file__).resolve().parent.parent / "gpu_exporter" / "report" /
                          "catalogue.yaml").read_text())  # fmt: skip
    doc["cards"].append({"name": "Spot T4", "match": ["Spot T4"], "memory_gib": 15, "fp16_tflops": 65,
                         "fp32_tflops": 8.1, "memory_bandwidth_gbps": 320, "price_per_hour": 0.11})  # fmt: skip
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    # 9 GiB x 1.2 = 10.8 GiB, 5% of 960 = 48 TFLOPS. Shipped, the A100 80GB's 1g.20gb (19.5 GiB, 44.6
    # TFLOPS) is cheapest: 1.80/7 x 48/44.6 = 0.277 USD/h, below the RTX 3090's 0.30.
    light = usage(H100, 9, 0.05, price=2.50)
    shipped = usd({"H100 80GB": 2.50}).advise(light)
    assert shipped is not None and shipped.suggested == "A100 80GB MIG 1g.20gb"
    mine = Sizer(load_catalogue(path), "USD", {"H100 80GB": 2.50}).advise(light)
    assert mine is not None and (mine.suggested, mine.suggested_price_per_hour) == ("Spot T4", 0.11)
    assert mine.saving_per_month == pytest.approx((2.50 - 0.11) * 730)
    # Only what the file lists: without the A100 80GB and its slices, the next cheapest, the RTX 3090.
    doc["cards"] = [c for c in doc["cards"] if c["name"] not in ("Spot T4", "A100 80GB")]
    path.write_text(yaml.safe_dump(doc))
    without = Sizer(load_catalogue(path), "USD", {"H100 80GB": 2.50}).advise(light)
    assert without is not None and (without.suggested, without.suggested_price_per_hour) == ("RTX 3090", 0.30)


CARD = {"name": "X1", "match": ["X1"], "memory_gib": 16, "fp16_tflops": 100, "fp32_tflops": 10,
        "memory_bandwidth_gbps": 300, "price_per_hour": 0.5}  # fmt: skip


def with_card(**changes: Any) -> str:
    card = {k: v for k, v in {**CARD, **changes}.items() if v is not None}
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
        ("currency: USD\ncards: []\n", "cards: List should have at least 1 item"),
        ("", "expected a mapping with 'currency' and 'cards', got nothing"),
        ("- T4\n- L4\n", "expected a mapping with 'currency' and 'cards', got a list"),
    ],
    ids=["bad-yaml", "missing-field", "negative-price", "infinite-price", "wrong-type", "zero-memory", "bad-regex",
         "too-many-slices", "unknown-key", "no-cards", "empty-file", "a-list"],
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


def test_an_unreadable_catalogue_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, problem in ((tmp_path / "missing.yaml", "No such file"), (tmp_path, "Is a directory")):
        assert main(["--prometheus.url", "http://127.0.0.1:9", "--catalogue", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"cannot read the catalogue {path}: {problem}" in err, err


def test_the_shipped_catalogue_has_the_cards_and_mig_profiles_the_issue_names() -> None:
    names = {o.name for o in SHIPPED.offers}
    assert {"T4", "V100 16GB", "V100 32GB", "A100 40GB", "A100 80GB", "RTX 3090", "RTX 4090", "L4", "L40S",
            "H100 80GB"} <= names  # fmt: skip
    assert {"A100 40GB MIG 1g.5gb", "A100 40GB MIG 3g.20gb", "A100 80GB MIG 1g.10gb", "A100 80GB MIG 3g.40gb",
            "H100 80GB MIG 1g.10gb", "H100 80GB MIG 2g.20gb", "H100 80GB MIG 7g.80gb"} <= names  # fmt: skip
    fp16 = {o.name: o.fp16_tflops for o in SHIPPED.offers}
    assert (fp16["T4"], fp16["V100 32GB"], fp16["A100 80GB"], fp16["RTX 3090"], fp16["RTX 4090"],
            fp16["H100 80GB"]) == (65, 125, 312, 142, 330, 960)  # fmt: skip
    # NVML's names find the right card: the first listed pattern wins.
    names_of = {H100: "H100 80GB", A100_80: "A100 80GB", A100_40: "A100 40GB", "Tesla T4": "T4",
                "NVIDIA L4": "L4", "NVIDIA L40S": "L40S", "Tesla V100-SXM2-16GB": "V100 16GB"}  # fmt: skip
    for nvml, card in names_of.items():
        found = SHIPPED.card_of(nvml)
        assert found is not None and found.name == card, nvml


# -- the activity the advice reads --------------------------------------------------------------------
@pytest.mark.parametrize("sm_first", [True, False], ids=["sm-activity-first", "gpu-util-first"])
def test_a_gpu_with_both_signals_in_the_range_is_judged_by_sm_activity(sm_first: bool) -> None:
    """Where SM activity (GPM) is missing at some steps of the range, Prometheus answers a series of
    each signal, in no set order; the report reads SM activity, as GpuUnderutilized does, whatever the
    order, so the same range always gives the same report."""
    from gpu_exporter.report.model import build
    from gpu_exporter.report.queries import window_for
    from tests.test_report_html import END, START, results

    r = results()
    key = {"node": "node-a", "instance": "node-a:9445", "gpu": "1", "uuid": "GPU-1"}
    util = [(key, 0.95)]  # GPU-Util says busy where SM activity says 18%
    r["activity"] = (r["activity"] + util) if sm_first else (util + r["activity"])
    doc = build(window_for(START, END), r, SHIPPED)
    (g,) = [g for g in doc["gpus"] if g["uuid"] == "GPU-1"]
    assert (g["activity_p95"], g["activity_signal"]) == (0.18, "SM activity")
    (rec,) = [x for x in doc["recommendations"] if x["uuid"] == "GPU-1"]
    assert "18% SM activity" in rec["reason"]


# -- what the advice is judged on: prices, boundaries, missing figures --------------------------------
def test_a_gpu_without_a_price_of_its_own_is_priced_at_what_the_fleet_pays_for_its_card() -> None:
    """A GPU whose exporter has no price for it (price_per_hour None) is judged at the fleet's price
    for its model; where the fleet has none either, nor a reference price in its currency, no advice."""
    light = usage(A100_80, 6.5, 0.04, price=None, held=50)
    a = usd({"A100 80GB": 1.75}).advise(light)
    assert a is not None and (a.suggested, a.suggested_price_per_hour) == ("A100 80GB MIG 1g.10gb", 0.25)
    assert a.saving_per_month == pytest.approx(547.5)  # as test_a_light_job_on_an_a100_... with its price
    assert Sizer(SHIPPED, "EUR", {}).advise(light) is None


def test_a_gpu_without_a_model_a_memory_peak_or_an_activity_gets_no_card() -> None:
    """The report cannot size a job it does not know the card, memory or compute of: no advice, and
    no failure (a GPU whose info series is missing has no model)."""
    light = usage(A100_80, 6.5, 0.04, price=1.75, held=50)
    sizer = usd({"A100 80GB": 1.75})
    assert sizer.advise(light) is not None
    assert sizer.advise(replace(light, model=None)) is None
    assert sizer.advise(replace(light, memory_peak_bytes=None)) is None
    assert sizer.advise(replace(light, activity_p95=None)) is None


def test_a_job_that_never_touched_the_gpus_memory_gets_the_cheapest_card_without_a_headroom_figure() -> None:
    """A pod that held an H100 for 100 h and used none of it (peak 0, activity 0): any offer holds it,
    and the cheapest priced one, the A100 40GB's 1g.5gb slice (1.30/7 = 0.186 USD/h), is advised.  Its
    headroom over a peak of 0 is not a percentage: the reason leaves it out rather than say 0%."""
    a = usd({"H100 80GB": 2.50}).advise(usage(H100, 0.0, 0.0, price=2.50))
    assert a is not None and a.suggested == "A100 40GB MIG 1g.5gb"
    assert a.suggested_price_per_hour == pytest.approx(1.30 / 7)
    assert a.saving_per_month == pytest.approx((2.50 - 1.30 / 7) * 730)
    assert "headroom" not in a.reason, a.reason
    assert "an A100 40GB MIG 1g.5gb would hold it; estimated saving $1,689/month" in a.reason, a.reason


def test_a_card_with_exactly_the_memory_the_job_needs_holds_it(tmp_path: Path) -> None:
    """The need is the peak x 1.2: a 10 GiB peak fits a 12 GiB card exactly, and that card is advised."""
    doc = {"currency": "USD", "cards": [
        {"name": "Big", "match": ["Big"], "memory_gib": 40, "fp16_tflops": 300, "fp32_tflops": 30,
         "memory_bandwidth_gbps": 1000, "price_per_hour": 3.00},
        {"name": "Twelve", "match": ["Twelve"], "memory_gib": 12, "fp16_tflops": 400, "fp32_tflops": 40,
         "memory_bandwidth_gbps": 1000, "price_per_hour": 1.00},
    ]}  # fmt: skip
    path = tmp_path / "twelve.yaml"
    path.write_text(yaml.safe_dump(doc))
    sizer = Sizer(load_catalogue(path), "USD", {"Big": 3.00})
    a = sizer.advise(usage("Big", 10, 0.5, price=3.00, total_gib=40))
    assert a is not None and (a.suggested, a.slowdown) == ("Twelve", 1.0)
    assert "with 20% headroom" in a.reason
    # A byte more than 10 GiB needs more than 12 GiB: nothing else is cheaper than Big.
    assert sizer.advise(usage("Big", 10 + 1 / GIB, 0.5, price=3.00, total_gib=40)) is None


def test_of_slices_that_cost_the_job_the_same_the_least_slowdown_wins_however_close() -> None:
    """6.5 slices' worth of an H100 (92.9% of 960 TFLOPS) in 3 GiB: every slice up to 4g.40gb is too slow
    and costs the job the same, 2.80 x 6.5 / 7 = 2.60 EUR/h (the whole 7g.80gb costs 2.80).  Of those,
    4g.40gb takes least long: 6.5 / 4 = 1.6x, against 3g.40gb's 2.2x (the same memory, listed first)."""
    sizer = Sizer(SHIPPED, "EUR", {"H100 80GB": 2.80}, min_saving_ratio=0.05)
    a = sizer.advise(usage(H100, 3, 6.5 / 7, price=2.80))
    assert a is not None and a.suggested == "H100 80GB MIG 4g.40gb"
    assert a.slowdown == pytest.approx(1.625) and "taking about 1.6x as long" in a.reason
    assert a.saving_per_month == pytest.approx((2.80 - 2.60) * 730)


def test_savings_under_one_unit_a_month_are_still_advised() -> None:
    """--min-saving defaults to 0: a GPU held 30 minutes of a 1000 h range saves cents, and is told so.
    (1.75 - 0.25) x 0.5 h x 730 / 1000 h = 0.5475 a month."""
    a = usd({"A100 80GB": 1.75}).advise(usage(A100_80, 6.5, 0.04, price=1.75, held=0.5, range_hours=1000))
    assert a is not None and a.saving_per_month == pytest.approx(0.5475)
    assert "estimated saving $0.55/month" in a.reason


# -- releasing an idle GPU -----------------------------------------------------------------------------
def idle_for(idle: float, range_hours: float = 100.0) -> Usage:
    return replace(usage(A100_80, 6.5, 0.04, price=1.75, range_hours=range_hours), held_hours=0.0, idle_hours=idle,
                   holder="")  # fmt: skip


@pytest.mark.parametrize(("idle", "released"), [(100, True), (95, True), (94.9, False), (50, False), (0.5, False)])
def test_a_gpu_idle_and_unheld_for_at_least_95_percent_of_the_range_is_advised_released(
    idle: float, released: bool
) -> None:
    """docs/cost.md: "A GPU idle and unheld for at least 95% of the range gets release"; one seen idle
    for less (the rest of the range down or not reported) is left alone."""
    a = usd({"A100 80GB": 1.75}).advise(idle_for(idle))
    assert (a is not None) is released
    if a is not None:
        assert (a.suggested, a.suggested_price_per_hour) == ("release", 0.0)
        assert a.saving_per_month == pytest.approx(1.75 * idle * 730 / 100)  # its price x the idle hours, a month


def test_min_saving_ratio_weighs_a_release_against_what_the_gpu_costs_over_the_range() -> None:
    """Releasing saves the idle hours' cost: 96 of 100 h is 96% of what the GPU costs, under a
    --min-saving-ratio of 0.97; 98 of 100 h is over it."""
    sizer = usd({"A100 80GB": 1.75}, min_saving_ratio=0.97)
    assert sizer.advise(idle_for(96)) is None
    a = sizer.advise(idle_for(98))
    assert a is not None and a.suggested == "release"
    # The same shares over a one-hour range and a four-week one.
    assert sizer.advise(idle_for(0.96, range_hours=1)) is None
    assert sizer.advise(idle_for(0.98 * 672, range_hours=672)) is not None
    assert sizer.advise(idle_for(0.96 * 672, range_hours=672)) is None
