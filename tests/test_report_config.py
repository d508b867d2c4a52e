"""``gpu-exporter report --config FILE``: the exporter's own config file serves the report too. Its
``pricing`` section prices the cards advice may suggest, its ``report`` section sets the advice
options (--allow-slower and the rest; a flag given wins), and the daemon accepts the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.command import UsageError, _options, build_parser, main
from gpu_exporter.report.output import OutputError, write
from gpu_exporter.report.prices import PRICING, PriceList
from gpu_exporter.report.settings import ReportConfigError
from gpu_exporter.report.settings import load as load_report
from gpu_exporter.settings.config import ConfigError, load_settings

URL = ("--prometheus.url", "http://127.0.0.1:9")


def config(tmp_path: Path, **sections: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"node_name": "gpu-7", **sections}))
    return path


def test_the_daemon_accepts_a_config_file_with_a_report_section(tmp_path: Path) -> None:
    path = config(tmp_path, pricing={"currency": "usd", "models": {"H100": 2.5}},
                  report={"allow_slower": True, "min_history": "12h"})  # fmt: skip
    settings = load_settings(config_file=path)
    assert settings.report.allow_slower and settings.report.min_history == 12 * 3600
    with pytest.raises(ConfigError, match="min_history"):
        load_settings(config_file=config(tmp_path, report={"min_history": "soon"}))


def test_the_report_section_sets_the_advice_options_and_a_flag_wins(tmp_path: Path) -> None:
    path = config(tmp_path, pricing={"currency": "eur", "models": {"L4": 0.6}},
                  report={"allow_slower": True, "allow_consumer_cards": True, "min_history": "2h",
                          "min_saving": 10, "min_saving_ratio": 0.3})  # fmt: skip
    opts, timeout = _options(build_parser().parse_args([*URL, "--config", str(path)]))
    assert (opts.allow_slower, opts.allow_consumer, opts.min_history_hours, opts.min_saving, opts.min_saving_ratio) \
        == (True, True, 2.0, 10, 0.3) and timeout == 120  # fmt: skip
    assert opts.pricing == PricingSettings(currency="EUR", models={"L4": 0.6})
    opts, _ = _options(build_parser().parse_args([*URL, "--config", str(path), "--min-history", "30m",
                                                  "--min-saving", "0", "--min-saving-ratio", "0.5"]))  # fmt: skip
    assert (opts.min_history_hours, opts.min_saving, opts.min_saving_ratio) == (0.5, 0, 0.5)
    defaults, _ = _options(build_parser().parse_args([*URL]))
    assert (defaults.allow_slower, defaults.allow_consumer, defaults.min_history_hours, defaults.pricing) == \
        (False, False, 24.0, None)  # fmt: skip
    assert _options(build_parser().parse_args([*URL, "--allow-slower"]))[0].allow_slower


def test_the_pricing_section_prices_the_cards_advice_may_suggest(tmp_path: Path) -> None:
    _, pricing = load_report(config(tmp_path, pricing={"currency": "USD", "models": {"L4": 0.6, "H100": 2.5}}))
    prices = PriceList(load_catalogue(), "USD", {}, pricing)
    l4 = prices.card("L4")
    assert l4 is not None and (l4.per_hour, l4.source) == (0.6, PRICING)
    assert prices.card("L40S") is None  # "L4" is not part of "L40S"


@pytest.mark.parametrize(
    ("sections", "problem"),
    [
        ({"report": {"allow_slowr": True}}, "report.allow_slowr: unknown key"),
        ({"report": {"min_saving_ratio": 2}}, "report.min_saving_ratio: Input should be less than or equal to 1"),
        ({"pricing": {"currency": "USD"}}, "pricing: pricing needs at least one of models, default or energy_per_kwh"),
    ],
    ids=["unknown-key", "ratio-over-1", "empty-pricing"],
)  # fmt: skip
def test_a_bad_section_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any],
                                         problem: str) -> None:  # fmt: skip
    path = config(tmp_path, **sections)
    with pytest.raises(ReportConfigError):
        load_report(path)
    assert main([*URL, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-exporter report: config file {path}: ") and problem in err, err


def test_an_unreadable_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*URL, "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--min-history"):
        _options(build_parser().parse_args([*URL, "--min-history", "often"]))


def test_output_never_follows_a_link_someone_else_planted(tmp_path: Path) -> None:
    """Issue 38: a link that `nobody` put in a sticky directory made root's `report --output` replace a
    root-only file (left 0644). A link owned by someone else is refused, naming it and its owner, and
    what it points to is untouched; the caller's own link is followed; a plain path is replaced."""
    if os.geteuid() != 0:
        pytest.skip("giving the link to nobody needs root (CI runs as root)")
    secret = tmp_path / "shadow"
    secret.write_text("root:hash\n")
    secret.chmod(0o600)
    planted = tmp_path / "report.txt"
    planted.symlink_to(secret)
    os.lchown(planted, 65534, 65534)  # nobody's
    with pytest.raises(OutputError) as e:
        write("the report\n", planted)
    assert str(planted) in str(e.value) and "uid 65534" in str(e.value)
    assert secret.read_text() == "root:hash\n" and (secret.stat().st_mode & 0o777) == 0o600
    mine = tmp_path / "mine.txt"
    mine.symlink_to(tmp_path / "target.txt")
    write("via my link\n", mine)
    assert (tmp_path / "target.txt").read_text() == "via my link\n" and mine.is_symlink()
    plain = tmp_path / "plain.txt"
    write("plain\n", plain)
    write("again\n", plain)
    assert plain.read_text() == "again\n"
