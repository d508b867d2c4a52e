"""What the catalogue makes of a card and of its MIG profiles (report/catalogue.py): the figures the
sizer compares a job with.  A user's own catalogue file, loaded in the test, so every figure is the
file's and each offer's is worked out here by hand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_exporter.report import catalogue as catalogue_module
from gpu_exporter.report.catalogue import GIB, CatalogueError, load_catalogue
from gpu_exporter.report.prices import CATALOGUE, Price, PriceList

CARD = {
    "name": "Z100", "match": ["Z100"], "memory_gib": 80, "fp16_tflops": 700, "memory_bandwidth_gbps": 3000,
    "fp64_tflops": 60, "fp32_tflops": 70, "fp16_vector_tflops": 140, "nvlink_gbps": 800, "compute_slices": 7,
    "price_per_hour": 3.5, "source": "a test card",
    "mig": [{"profile": "1g.10gb", "slices": 1, "memory_gib": 10},
            {"profile": "3g.40gb", "slices": 3, "memory_gib": 40},
            {"profile": "7g.80gb", "slices": 7, "memory_gib": 80}],
}  # fmt: skip


def catalogue(tmp_path: Path, *cards: dict[str, object]) -> Path:
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump({"currency": "usd", "cards": list(cards)}))
    return path


def test_a_card_and_each_slice_carry_their_share_of_every_figure(tmp_path: Path) -> None:
    cat = load_catalogue(catalogue(tmp_path, CARD))
    offers = {o.name: o for o in cat.offers}
    card, one, three, whole = (offers[n] for n in ("Z100", "Z100 MIG 1g.10gb", "Z100 MIG 3g.40gb", "Z100 MIG 7g.80gb"))
    assert cat.currency == "USD"
    assert (card.memory_bytes, card.fp16_tflops, card.memory_bandwidth_gbps, card.price_per_hour) == (
        80 * GIB, 700, 3000, 3.5)  # fmt: skip
    assert (card.fp64_tflops, card.fp32_tflops, card.fp16_vector_tflops) == (60, 70, 140)
    assert card.nvlink_gbps_each_way == 400 and card.slices == 7 and not card.mig and card.whole_card
    # A slice: its share of the SMs (so of every pipe and the price), of the memory's bandwidth, no NVLink.
    assert one.card == "Z100" and one.mig and one.slices == 1 and one.of_slices == 7 and one.share == 1 / 7
    assert one.memory_bytes == 10 * GIB and one.memory_bandwidth_gbps == pytest.approx(3000 * 10 / 80)
    assert one.fp16_tflops == pytest.approx(100) and one.price_per_hour == pytest.approx(0.5)
    assert (one.fp64_tflops, one.fp32_tflops, one.fp16_vector_tflops) == pytest.approx((60 / 7, 10, 20))
    assert one.nvlink_gbps_each_way == 0 and not one.whole_card and not one.consumer
    assert three.fp16_tflops == pytest.approx(300) and three.memory_bandwidth_gbps == pytest.approx(1500)
    assert [three.rate(p) for p in ("tensor", "fp64", "fp32", "fp16")] == pytest.approx([300, 180 / 7, 30, 60])
    assert whole.whole_card and whole.memory_bandwidth_gbps == 3000 and whole.price_per_hour == pytest.approx(3.5)


def test_a_slice_of_a_card_without_a_stated_rate_or_price_states_none(tmp_path: Path) -> None:
    bare = {k: v for k, v in CARD.items() if k not in ("fp64_tflops", "price_per_hour")}
    offers = {o.name: o for o in load_catalogue(catalogue(tmp_path, bare)).offers}
    one = offers["Z100 MIG 1g.10gb"]
    assert one.fp64_tflops is None and one.price_per_hour is None and one.rate("fp64") is None


def test_an_a30s_slices_are_quarters(tmp_path: Path) -> None:
    a30 = {**CARD, "name": "Q30", "match": ["Q30"], "compute_slices": 4,
           "mig": [{"profile": "1g.6gb", "slices": 1, "memory_gib": 20}]}  # fmt: skip
    (one,) = [o for o in load_catalogue(catalogue(tmp_path, a30)).offers if o.mig]
    assert one.of_slices == 4 and one.share == 0.25 and one.fp16_tflops == pytest.approx(175)
    assert one.memory_bandwidth_gbps == pytest.approx(750)


def test_a_whole_four_slice_card_is_all_of_itself_at_its_own_price(tmp_path: Path) -> None:
    """An A30 has 4 compute slices: the card itself is 4 of 4, not 7 of 4 (which priced it at 7/4 of its price)."""
    a30 = {**CARD, "name": "Q30", "match": ["Q30"], "compute_slices": 4, "price_per_hour": 1.2,
           "mig": [{"profile": "4g.24gb", "slices": 4, "memory_gib": 24}]}  # fmt: skip
    cat = load_catalogue(catalogue(tmp_path, a30))
    card, whole = cat.offers
    assert not card.mig and card.whole_card and card.share == 1 and card.of_slices == 4
    assert whole.mig and whole.whole_card and whole.share == 1
    assert PriceList(cat, "USD", {}).of(card) == Price(1.2, CATALOGUE)


@pytest.mark.parametrize(
    ("change", "facts"),
    [
        ({"memory_gib": -1}, ["cards[0] (Z100)", "memory_gib"]),
        ({"name": ""}, ["cards[0]", "name"]),
        ({"memory_gib": "lots"}, ["cards[0] (Z100)", "memory_gib", "'lots'"]),
        ({"surprise": 1}, ["cards[0] (Z100)", "surprise", "unknown key"]),
    ],
)
def test_a_bad_card_is_named_by_its_place_and_name(tmp_path: Path, change: dict[str, object], facts: list[str]) -> None:
    with pytest.raises(CatalogueError) as e:
        load_catalogue(catalogue(tmp_path, {**CARD, **change}))
    missing = [f for f in facts if f not in str(e.value)]
    assert not missing, (str(e.value), missing)


def test_a_bad_value_outside_the_cards_is_named_without_a_card(tmp_path: Path) -> None:
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump({"currency": 5, "cards": [CARD]}))
    with pytest.raises(CatalogueError) as e:
        load_catalogue(path)
    assert "currency" in str(e.value) and "cards[" not in str(e.value)


def problem(path: Path) -> str:
    with pytest.raises(CatalogueError) as e:
        load_catalogue(path)
    return str(e.value)


def test_a_card_without_a_usable_name_is_named_by_its_place_alone(tmp_path: Path) -> None:
    """No made-up name ("None", "5", "") between a nameless card's place and the field to fix."""
    nameless = {k: v for k, v in CARD.items() if k != "name"}
    assert "cards[0]: name: missing" in problem(catalogue(tmp_path, nameless))
    assert "cards[0]: name: " in problem(catalogue(tmp_path, {**CARD, "name": ""}))
    msg = problem(catalogue(tmp_path, {**CARD, "name": 5}))
    assert "cards[0]: name: " in msg and "(got 5)" in msg


@pytest.mark.parametrize(("text", "got"), [("cards: [5]\n", "(got 5)"), ("cards: !!set {L4}\n", "(got 'L4')")])
def test_a_card_that_is_not_a_mapping_is_named_by_its_place_and_value(tmp_path: Path, text: str, got: str) -> None:
    """A list of cards that holds a number, or a YAML set of names: an error, not a crash."""
    path = tmp_path / "cards.yaml"
    path.write_text(text)
    msg = problem(path)
    assert "cards[0]" in msg and got in msg, msg


def test_a_profile_wider_than_its_card_names_the_card_the_profile_and_compute_slices(tmp_path: Path) -> None:
    q30 = {**CARD, "compute_slices": 4}
    msg = problem(catalogue(tmp_path, q30))
    assert all(f in msg for f in ("cards[0] (Z100)", "7g.80gb", "compute_slices", "(4)")), msg
    assert "a test card" not in msg, msg  # the error is on the card as a whole: not the whole card repeated


def test_a_bad_value_outside_the_cards_follows_the_file_it_is_in(tmp_path: Path) -> None:
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump({"currency": 5, "cards": [CARD]}))
    msg = problem(path)
    assert f"catalogue {path}: currency: " in msg and "(got 5)" in msg, msg


def test_every_problem_of_a_file_is_told_each_with_its_card(tmp_path: Path) -> None:
    y100 = {**CARD, "name": "Y100", "fp16_tflops": "fast"}
    path = catalogue(tmp_path, {**CARD, "memory_gib": -1}, y100)
    first, second = problem(path).removeprefix(f"catalogue {path}: ").split("; ")
    assert first.startswith("cards[0] (Z100): memory_gib: ") and "(got -1)" in first, first
    assert second.startswith("cards[1] (Y100): fp16_tflops: ") and "(got 'fast')" in second, second


def test_a_character_yaml_refuses_is_named_with_no_place_made_up(tmp_path: Path) -> None:
    """PyYAML's reader tells no line or problem apart from its message: that message is the problem."""
    path = tmp_path / "cards.yaml"
    path.write_text("cards: [\x01]\n")
    msg = problem(path)
    assert str(path) in msg and re.search(r"not valid YAML: .*#x0001", msg), msg


def test_a_file_that_is_not_text_is_named_with_the_byte_that_is_not(tmp_path: Path) -> None:
    path = tmp_path / "cards.yaml"
    path.write_bytes(b"cards: [\xff]\n")
    msg = problem(path)
    assert f"cannot read the catalogue {path}: " in msg and "0xff" in msg, msg


@pytest.mark.integration  # a Python of its own, under LC_ALL=C
def test_a_catalogue_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """A latin-1 locale (LANG=de_DE.ISO-8859-1 on an old host) must not misread a card's name or source."""
    path = tmp_path / "cards.yaml"
    path.write_text("cards:\n- {name: Rechenkarte \u00b5, match: [x], memory_gib: 8, fp16_tflops: 10, "
                    "memory_bandwidth_gbps: 100}\n", encoding="utf-8")  # fmt: skip
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONIOENCODING": "utf-8"}  # fmt: skip
    code = ("import sys; from pathlib import Path; from gpu_exporter.report.catalogue import load_catalogue; "
            "sys.stdout.write(ascii([o.name for o in load_catalogue(Path(sys.argv[1])).offers]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ascii(["Rechenkarte \u00b5"])


def test_the_shipped_catalogue_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken or missing catalogue.yaml in the package (a packager's or a contributor's mistake)."""
    monkeypatch.setattr(catalogue_module, "files", lambda package: tmp_path)
    with pytest.raises(CatalogueError, match=re.escape("cannot read the catalogue catalogue.yaml (shipped): ")):
        load_catalogue()
    (tmp_path / "catalogue.yaml").write_text("cards: []\n")
    with pytest.raises(CatalogueError, match=re.escape("catalogue catalogue.yaml (shipped): cards: ")):
        load_catalogue()


def test_every_offer_of_a_consumer_card_is_a_consumer_one(tmp_path: Path) -> None:
    offers = load_catalogue(catalogue(tmp_path, {**CARD, "consumer": True})).offers
    assert len(offers) == 4 and all(o.consumer is True for o in offers)


def test_a_profile_that_states_more_memory_than_its_card_has_no_more_than_its_bandwidth(tmp_path: Path) -> None:
    roomy = {**CARD, "memory_gib": 79.5, "mig": [{"profile": "7g.80gb", "slices": 7, "memory_gib": 120}]}
    (_, whole) = load_catalogue(catalogue(tmp_path, roomy)).offers
    assert whole.memory_bandwidth_gbps == 3000


def test_a_cards_patterns_match_nvmls_name_in_any_case(tmp_path: Path) -> None:
    cat = load_catalogue(catalogue(tmp_path, {**CARD, "match": ["z100"]}))
    card = cat.card_of("NVIDIA Z100-SXM5-80GB")
    assert card is not None and card.name == "Z100"
    assert cat.card_of("NVIDIA Y100") is None
