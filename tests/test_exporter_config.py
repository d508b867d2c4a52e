"""Configuration: precedence of the sources, and a clear exit 2 on every kind of bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_exporter.cli import main
from gpu_exporter.once import UNKNOWN
from gpu_exporter.settings.config import ConfigError, load_settings


def test_defaults() -> None:
    s = load_settings()
    assert s.web_listen_address == ":9445" and s.poll_interval == 5.0 and not s.simulate


def test_precedence_cli_over_env_over_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("poll_interval: 30s\nlog_level: debug\nsimulate_gpus: 7\nlisten_address: ':1111'\n")
    monkeypatch.setenv("GPU_EXPORTER_POLL_INTERVAL", "10s")
    monkeypatch.setenv("GPU_EXPORTER_SIMULATE_GPUS", "3")
    s = load_settings({"poll_interval": "2s"}, cfg)
    assert s.poll_interval == 2.0  # flag
    assert s.simulate_gpus == 3  # env beats the file
    assert s.log_level == "debug"  # file beats the default
    assert s.web_listen_address == ":1111"


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("15s", 15), ("2m", 120), ("1h", 3600), ("7", 7)])
def test_durations(text: str, seconds: float) -> None:
    assert load_settings({"poll_interval": text}).poll_interval == seconds


@pytest.mark.parametrize(
    ("argv", "env", "yaml_text", "needles"),
    [
        (["--poll.interval=-1s"], {}, None, ["poll_interval", "-1s", "duration"]),
        (["--poll.interval", "0"], {}, None, ["poll_interval", "greater than 0"]),
        (["--web.listen-address", "localhost"], {}, None, ["listen_address", "'localhost'", "HOST:PORT"]),
        (["--web.listen-address", ":99999"], {}, None, ["listen_address", "0 to 65535"]),
        ([], {"GPU_EXPORTER_LOG_FORMAT": "xml"}, None, ["log_format", "'xml'", "'logfmt', 'json' or 'console'"]),
        ([], {"GPU_EXPORTER_SIMULATE_GPUS": "lots"}, None, ["simulate_gpus", "'lots'", "integer"]),
        ([], {}, "poll_intervall: 5s\n", ["unknown setting 'poll_intervall'", "poll_interval"]),
        ([], {}, "- a\n- list\n", ["must hold a mapping"]),
        ([], {}, "poll_interval: [unclosed\n", ["not valid YAML"]),
        (["--simulate.gpus", "0"], {}, None, ["simulate_gpus", "greater than or equal to 1"]),
        ([], {}, "rules:\n  GpuMemoryHot: {}\n", ["unknown setting 'rules.GpuMemoryHot'", "GpuMemoryHigh"]),
        ([], {}, "rules:\n  GpuLost:\n    for: -5m\n", ["rules.GpuLost.for", "cannot be negative"]),
        (
            [],
            {},
            "rules:\n  GpuMemoryHigh:\n    warning: 1.5\n",
            ["rules.GpuMemoryHigh.warning", "1.5", "less than or equal to 1"],
        ),
        ([], {}, "rules:\n  GpuMemoryHigh:\n    warning: 0.99\n", ["above critical 0.98", "set critical to 0.99"]),
        (
            [],
            {},
            "alerting:\n  alertmanagers:\n    - url: am:9093\n",
            ["alerting.alertmanagers.0.url", "http:// or https://"],
        ),
    ],
)
def test_bad_input_is_refused_naming_the_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], env: dict[str, str], yaml_text: str | None, needles: list[str],
) -> None:  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if yaml_text is not None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml_text)
        argv = [*argv, "--config", str(cfg)]
    assert main([*argv, "--once"]) == UNKNOWN  # --once is a check
    err = capsys.readouterr().err
    assert err.startswith("gpu-exporter: ")
    for needle in needles:
        assert needle in err, (needle, err)


def test_unreadable_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "missing.yaml"), "--once"]) == UNKNOWN  # --once is a check
    assert f"cannot read config file {tmp_path / 'missing.yaml'}" in capsys.readouterr().err


def test_bad_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--log.format", "xml"])
    assert e.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_config_error_type() -> None:
    with pytest.raises(ConfigError):
        load_settings({"gpu_timeout": "forever"})


def test_nested_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_EXPORTER_RULES__GPUMEMORYHIGH__WARNING", "0.95")
    monkeypatch.setenv("GPU_EXPORTER_ALERTING__ALERTMANAGERS", '[{"url": "http://am:9093"}]')
    s = load_settings()
    assert s.rules.GpuMemoryHigh.warning == 0.95
    assert [r.url for r in s.alerting.alertmanagers] == ["http://am:9093"]


def test_rule_settings_from_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rules:\n  GpuIdle: {enabled: true, for: 2h}\n  GpuXidError: {codes: [79]}\n")
    s = load_settings(None, cfg)
    assert s.rules.GpuIdle.enabled and s.rules.GpuIdle.for_ == 7200 and s.rules.GpuXidError.codes == [79]
    assert s.rules.GpuMemoryHigh.warning == 0.90  # untouched rules keep their defaults


@pytest.mark.parametrize(
    ("argv", "env", "yaml_text", "source"),
    [
        (["--poll.interval=-1s"], {}, None, "(from flag --poll.interval)"),
        (["--poll.gpu-timeout", "soon"], {}, "poll_gpu_timeout: 5s\n", "(from flag --poll.gpu-timeout)"),
        ([], {"GPU_EXPORTER_POLL_INTERVAL": "soon"}, "poll_interval: 5s\n", "(from GPU_EXPORTER_POLL_INTERVAL)"),
        ([], {}, "poll_interval: soon\n", "(from config file {cfg})"),
        ([], {"GPU_EXPORTER_RULES": '{"GpuLost": {"for": "-5m"}}'}, None, "(from GPU_EXPORTER_RULES)"),
        (["--alerting.alertmanager-url", "am:9093"], {}, None, "(from flag --alerting.alertmanager-url)"),
    ],
)
def test_a_bad_value_names_the_one_source_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], env: dict[str, str], yaml_text: str | None, source: str,
) -> None:  # fmt: skip
    """A newcomer read "flag, GPU_EXPORTER_… or config key …" and had to find which of the three was
    wrong: the message names the source whose value was used, the one to fix."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = tmp_path / "c.yaml"
    if yaml_text is not None:
        cfg.write_text(yaml_text)
        argv = [*argv, "--config", str(cfg)]
    assert main([*argv, "--once"]) == UNKNOWN
    err = capsys.readouterr().err
    assert source.format(cfg=cfg) in err, err
    assert "config key" not in err and " or " not in err.split(" = ", 1)[0], err


@pytest.mark.parametrize(
    ("env", "yaml_text", "hint"),
    [
        ({}, "rules:\n  GpuMemoryHigh:\n    warning: 80\n", "a ratio is meant (0 to 1): 80% is 0.8"),
        ({"GPU_EXPORTER_RULES__GPUUNDERUTILIZED__THRESHOLD": "10"}, None, "10% is 0.1"),
    ],
)
def test_a_percentage_given_for_a_ratio_says_the_ratio_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], yaml_text: str | None, hint: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = None
    if yaml_text is not None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match=re.escape(hint)):
        load_settings(None, cfg)
    # 150 cannot be a percentage of a ratio of 0 to 1: no such hint where it is not one.
    for k in env:
        monkeypatch.delenv(k)
    with pytest.raises(ConfigError) as e:
        load_settings({"rules": {"GpuMemoryHigh": {"warning": 150}}})
    assert "a ratio is meant" not in str(e.value)
