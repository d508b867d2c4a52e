"""Issue 48: a pricing key means the same card in the daemon and in the advice.  With the shipped
example, ``"A100-SXM4-80GB": 1.80`` never matched the catalogue's "A100 80GB", which took the plain
``A100`` price of 1.30: the report said "saves about $876/month" where the daemon's own price gives
$511.  The report now matches a key against the names NVML gives each card (the catalogue's
``names``), as the daemon does; a key that matches none of the names of the cards it looks like is
refused at start, by the daemon and the report, with the names it could mean, where it names a card
of the catalogue; one of a known model that matches none of its names is said."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_exporter.accounting.pricing import PriceBook
from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.report.catalogue import CatalogueError, load_catalogue
from gpu_exporter.report.prices import PriceList, key_problems
from gpu_exporter.settings.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "pricing.example.yaml"
CATALOGUE = load_catalogue()


def example() -> PricingSettings:
    settings = load_settings(config_file=EXAMPLE)
    assert settings.pricing is not None
    return settings.pricing


def test_the_shipped_example_prices_each_card_as_the_daemon_prices_its_gpus() -> None:
    pricing = example()
    assert key_problems(pricing.models, CATALOGUE) == ([], [])
    daemon, report = PriceBook(pricing.model_copy(update={"default": None})), PriceList(CATALOGUE, "USD", {}, pricing)
    checked = 0
    for card, names in CATALOGUE.names.items():
        charged = [p for n in names if (p := daemon.per_hour(n)) is not None]
        quoted = report.card(card)
        assert (quoted.per_hour if quoted else None) == (max(charged) if charged else None), (card, names)
        checked += bool(charged)
    assert checked >= 6  # H100s, A100s, L40S, L4, T4 are priced by the example
    a100 = report.card("A100 80GB")
    assert a100 is not None and a100.per_hour == 1.80  # not the plain A100's 1.30


def test_the_saving_is_the_daemons_price_difference() -> None:
    """The issue's figure: an H100 at 2.50 moving to an A100 80GB saves (2.50 - 1.80) x 730 = $511."""
    quoted = PriceList(CATALOGUE, "USD", {}, example()).card("A100 80GB")
    assert quoted is not None and round((2.50 - quoted.per_hour) * 730) == 511


def test_every_name_of_the_catalogue_is_recognised_as_its_card() -> None:
    assert len(CATALOGUE.names) == len({o.card for o in CATALOGUE.offers})
    for card, names in CATALOGUE.names.items():
        for name in names:
            found = CATALOGUE.card_of(name)
            assert found is not None and found.name == card, (card, name)


def test_a_catalogue_name_recognised_as_another_card_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump({"cards": [
        {"name": "H100 PCIe", "match": ["H100 PCIe"], "names": ["NVIDIA H100 PCIe"], "memory_gib": 80,
         "fp16_tflops": 756, "memory_bandwidth_gbps": 2000},
        {"name": "H100 80GB", "match": ["H100"], "names": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"],
         "memory_gib": 80, "fp16_tflops": 989, "memory_bandwidth_gbps": 3350}]}))  # fmt: skip
    with pytest.raises(CatalogueError, match=r"H100 80GB: its name 'NVIDIA H100 PCIe' is recognised as H100 PCIe"):
        load_catalogue(path)


@pytest.mark.parametrize(
    ("key", "could_mean"),
    [("V100 SXM2 16GB", ["'V100-SXM2-16GB'"]), ("V100 PCIe 32GB", ["'V100-PCIE-32GB'"])],
)  # fmt: skip
def test_a_key_naming_a_catalogue_card_but_no_gpu_as_nvml_does_is_refused(key: str, could_mean: list[str]) -> None:
    refused, doubtful = key_problems({key: 2.0, "L4": 0.5}, CATALOGUE)
    assert doubtful == [] and len(refused) == 1
    assert refused[0].startswith(f"pricing key {key!r} names the catalogue's ")
    for name in could_mean:
        assert name in refused[0].split("write the name NVML gives it: ", 1)[1]


def test_a_key_of_a_known_model_that_matches_none_of_its_names_is_doubtful_and_another_model_let_be() -> None:
    """ "H100 SXM" is no NVML name of an H100 (an "H100 80GB HBM3"): said, with the H100s' names; but a
    key may name a card the catalogue does not offer ("H200 NVL"), so it is not refused.  GH200, V100S
    and K80 are models the catalogue does not know: nothing to say."""
    refused, doubtful = key_problems({"H100 SXM": 2.5, "GH200": 3.5, "Tesla V100S-PCIE-32GB": 1.0, "K80": 0.2},
                                     CATALOGUE)  # fmt: skip
    assert refused == []
    (said,) = doubtful
    assert said.startswith("pricing key 'H100 SXM' matches none of the names NVML gives")
    assert all(n in said for n in ("'H100 80GB HBM3'", "'H100 NVL'", "'H100 PCIe'"))


@pytest.mark.integration
def test_the_daemon_and_the_report_refuse_such_a_key_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"pricing": {"currency": "USD", "models": {"V100 SXM2 16GB": 2.5}}}))
    for argv in (
        ["--config", str(cfg)],
        ["report", "--config", str(cfg), "--prometheus.url", "http://127.0.0.1:9", "--since", "1h"],
    ):
        out = subprocess.run([sys.executable, "-m", "gpu_exporter", *argv], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert out.returncode == 2, out
        assert "pricing key 'V100 SXM2 16GB'" in out.stderr and "'V100-SXM2-16GB'" in out.stderr, out.stderr
