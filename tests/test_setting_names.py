"""One naming rule between a flag, its config key and its environment variable (issue 34, item 4).

``--poll.gpu-timeout`` is the key ``poll_gpu_timeout`` and ``GPU_EXPORTER_POLL_GPU_TIMEOUT``: the key
is the flag with ``.`` and ``-`` made ``_``, the variable the key's path in capitals, ``__`` between
levels, after ``GPU_EXPORTER_``. Every flag is checked against the rule here, and each one that
breaks it must be named in docs/running.md's configuration paragraph (and each one named there must
break it), so the paragraph says the truth about every flag. The three settings that once broke it
(``listen_address``, ``static_refresh_interval``, ``gpu_timeout``) are still read under those keys,
so no file or unit written for them breaks; the code knows them by their key alone (issue 51, item 4).
A setting flag's help is its field's description and default, so the two cannot drift apart.
dcgm-exporter's ``--hpc-job-mapping-dir`` and its ``DCGM_HPC_JOB_MAPPING_DIR`` set
``slurm.job_mapping_dir``, so its users need not rewrite their units.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.cli import build_parser, main, settings_from_flags
from gpu_exporter.once import UNKNOWN
from gpu_exporter.settings.config import ENV_PREFIX, OLD_KEYS, SETTING_KEYS, ConfigError, Settings, load_settings
from gpu_exporter.settings.durations import format_duration, parse_duration

ROOT = Path(__file__).resolve().parent.parent
NOT_SETTINGS = {"--help", "--version", "--config", "--once", "--format"}  # what to do, not how
# A value each flag that takes one accepts (a new flag needs one here).
SAMPLES = {
    "--web.listen-address": "127.0.0.1:9999", "--web.config.file": "/etc/gpu-exporter/web.yml",
    "--web.max-requests": "7", "--poll.interval": "7s", "--poll.static-refresh-interval": "7m",
    "--poll.gpu-timeout": "7s", "--poll.release-for": "7m", "--profiling.interval": "7s", "--simulate.gpus": "9",
    "--poll.slow-interval": "7s",
    "--log.format": "logfmt",
    "--log.level": "debug", "--node.name": "node-7", "--alerting.alertmanager-url": "http://am:9093",
    "--alerting.webhook-url": "http://hooks:8080/gpu", "--hpc-job-mapping-dir": "<tmp>",
}  # fmt: skip


def setting_flags() -> list[argparse.Action]:
    return [a for a in build_parser()._actions if a.option_strings and not set(a.option_strings) & NOT_SETTINGS]


def leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += leaves(value, (*path, key))
        else:
            out.append(((*path, key), value))
    return out


def what_it_sets(flag: str, tmp: Path) -> dict[str, Any]:
    action = next(a for a in build_parser()._actions if flag in a.option_strings)
    argv = [flag] if action.nargs == 0 else [flag, SAMPLES[flag].replace("<tmp>", str(tmp))]
    return settings_from_flags(build_parser().parse_args(argv))


def rule_key(flag: str) -> str:
    return flag.removeprefix("--").replace(".", "_").replace("-", "_")


def breaks_the_rule(flag: str, tmp: Path) -> bool:
    return [path for path, _ in leaves(what_it_sets(flag, tmp))] != [(rule_key(flag),)]


def readme_exceptions() -> str:
    section = (ROOT / "docs" / "running.md").read_text().split("## Configuration", 1)[1]
    m = re.search(r"Except (.*?)\. A bad value", section, flags=re.DOTALL)
    assert m, "docs/running.md's configuration paragraph no longer lists the flags that break the rule"
    return m.group(1)


def test_every_flag_follows_the_rule_or_the_readme_names_it(tmp_path: Path) -> None:
    flags = [s for a in setting_flags() for s in a.option_strings]
    assert len(flags) > 20  # the collectors' included
    breaking = {f for f in flags if breaks_the_rule(f, tmp_path)}
    listed = readme_exceptions()
    patterns = []  # `--[no-]collector.<name>` stands for --collector.* and --no-collector.*
    for named in re.findall(r"`(--[^`]+)`", listed):
        named = named.replace("<name>", "*")
        patterns += [named.replace("[no-]", ""), named.replace("[no-]", "no-")] if "[no-]" in named else [named]
    unlisted = sorted(f for f in breaking if not any(fnmatch(f, p) for p in patterns))
    assert unlisted == [], f"flags that break the naming rule and that docs/running.md does not name: {unlisted}"
    needless = sorted(p for p in patterns if not any(fnmatch(f, p) for f in breaking))
    assert needless == [], f"docs/running.md names flags that follow the rule (or do not exist): {needless}"
    # Where a flag sets one setting, docs/running.md names it beside the flag.
    for flag in sorted(breaking):
        paths = [path for path, _ in leaves(what_it_sets(flag, tmp_path))]
        if len(paths) == 1 and not flag.startswith(("--collector.", "--no-collector.", "--alerting.")):
            assert ".".join(paths[0]) in listed, (flag, paths[0])


@pytest.mark.parametrize("flag", [s for a in setting_flags() for s in a.option_strings[:1]])
def test_the_flag_its_environment_variable_and_its_key_set_the_same(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = what_it_sets(flag, tmp_path)
    [(path, _)] = leaves(given)[:1]
    top = SETTING_KEYS[path[0]]  # the attribute: a renamed setting keeps its old one
    from_flag = getattr(load_settings(given), top)
    # The environment: the key's path in capitals after GPU_EXPORTER_, "__" between levels; a
    # list or mapping below the path as JSON.
    if path[0] == "alerting":
        env = {ENV_PREFIX + "ALERTING__" + k.upper(): json.dumps(v) for k, v in given["alerting"].items()}
    else:
        env = {ENV_PREFIX + "__".join(p).upper(): str(v).lower() if isinstance(v, bool) else str(v)
               for p, v in leaves(given)}  # fmt: skip
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        from_env = getattr(load_settings(), top)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(given))
    from_file = getattr(load_settings(None, cfg), top)
    assert from_flag == from_env == from_file, (flag, env)
    if not flag.startswith("--collector."):  # on by default; --no-collector.<name> is the one that shows
        assert from_flag != getattr(load_settings(), top), f"{flag}'s sample is the default: it proves nothing"


def test_dcgm_exporters_flag_and_variable_set_the_job_mapping_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag_dir, ours, theirs, in_file = (tmp_path / n for n in ("flag", "ours", "theirs", "file"))
    for d in (flag_dir, ours, theirs, in_file):
        d.mkdir()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"slurm": {"job_mapping_dir": str(in_file), "job_from_cgroup": True}}))

    def mapping_dir(*argv: str) -> str | None:
        s = load_settings(settings_from_flags(build_parser().parse_args(list(argv))), cfg)
        assert s.slurm.job_from_cgroup  # the file's other Slurm setting stays
        return s.slurm.job_mapping_dir

    assert mapping_dir() == str(in_file)
    monkeypatch.setenv("DCGM_HPC_JOB_MAPPING_DIR", str(theirs))
    assert mapping_dir() == str(theirs)  # dcgm-exporter's variable beats the file
    monkeypatch.setenv("GPU_EXPORTER_SLURM__JOB_MAPPING_DIR", str(ours))
    assert mapping_dir() == str(ours)  # ours beats dcgm-exporter's
    assert mapping_dir("--hpc-job-mapping-dir", str(flag_dir)) == str(flag_dir)  # the flag beats both
    monkeypatch.delenv("GPU_EXPORTER_SLURM__JOB_MAPPING_DIR")
    monkeypatch.setenv("DCGM_HPC_JOB_MAPPING_DIR", "")
    assert mapping_dir() == str(in_file)  # empty is unset, as in dcgm-exporter


@pytest.mark.parametrize("source", ["flag", "variable"])
def test_a_bad_job_mapping_dir_names_dcgm_exporters_names_too(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    argv = ["--once"]
    if source == "flag":
        argv += ["--hpc-job-mapping-dir", str(not_a_dir)]
    else:
        monkeypatch.setenv("DCGM_HPC_JOB_MAPPING_DIR", str(not_a_dir))
    assert main(argv) == UNKNOWN
    err = capsys.readouterr().err
    # dcgm-exporter's name, the one the value came from (issue 51: not every name it might have had).
    given = "from flag --hpc-job-mapping-dir" if source == "flag" else "from DCGM_HPC_JOB_MAPPING_DIR"
    for needle in ("slurm.job_mapping_dir", given, "is not a directory"):
        assert needle in err, (needle, err)


# --- Help and defaults from the fields; the renamed settings' old keys ---------------------------

# The default each setting flag's help must show, as the user would write it.
SHOWN_DEFAULTS = {
    "--web.listen-address": ":9445", "--web.config.file": "none", "--web.max-requests": "40",
    "--poll.interval": "5s", "--profiling.interval": "10s", "--poll.static-refresh-interval": "5m",
    "--poll.gpu-timeout": "10s", "--poll.release-for": "10m", "--simulate": "off", "--simulate.gpus": "7",
    "--poll.slow-interval": "30s",
    "--log.format": "auto",
    "--log.level": "info", "--node.name": "none",
}  # fmt: skip
RENAMED = {"listen_address": "web_listen_address", "static_refresh_interval": "poll_static_refresh_interval",
           "gpu_timeout": "poll_gpu_timeout"}  # fmt: skip
# A value for each renamed setting that is not its default.
NEW_VALUES = {"web_listen_address": "127.0.0.1:9999", "poll_static_refresh_interval": "7m", "poll_gpu_timeout": "7s"}


def field_flags() -> list[argparse.Action]:
    """The flags whose dest is a top-level key of the settings: one setting each."""
    return [a for a in setting_flags() if a.dest in SETTING_KEYS]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_setting_flag_is_its_key_by_the_rule() -> None:
    flags = field_flags()
    assert sorted(a.option_strings[0] for a in flags) == sorted(SHOWN_DEFAULTS)
    for action in flags:
        [flag] = action.option_strings
        assert action.dest == rule_key(flag), flag


@pytest.mark.parametrize("flag", sorted(SHOWN_DEFAULTS))
def test_a_setting_flags_help_is_its_fields_description_and_default(flag: str) -> None:
    action = next(a for a in field_flags() if flag in a.option_strings)
    field = Settings.model_fields[SETTING_KEYS[action.dest]]
    assert field.description and field.description in (action.help or ""), (flag, action.help)
    assert f"(default {SHOWN_DEFAULTS[flag]})" in (action.help or ""), (flag, action.help)
    if flag.startswith(("--poll.", "--profiling.")):  # a duration: what the help shows reads back as the default
        assert parse_duration(SHOWN_DEFAULTS[flag]) == field.default
    # The help as --help prints it: argparse formats it, and a stray % would fail here.
    assert SHOWN_DEFAULTS[flag] in build_parser().format_help()


@pytest.mark.parametrize(
    ("seconds", "written"),
    [(5, "5s"), (300, "5m"), (10, "10s"), (90, "90s"), (0.5, "500ms"), (3600, "1h"), (86_400, "1d"),
     (1_209_600, "2w"), (0, "0s")],
)  # fmt: skip
def test_a_duration_is_shown_as_one_would_write_it(seconds: float, written: str) -> None:
    assert format_duration(seconds) == written
    assert parse_duration(written) == seconds


def test_the_renamed_settings_and_their_old_keys() -> None:
    assert OLD_KEYS == RENAMED
    for key in RENAMED.values():
        assert SETTING_KEYS[key] == key  # one name end to end: the code reads settings.<key>


@pytest.mark.parametrize(("old", "key"), sorted(RENAMED.items()))
def test_the_old_and_the_new_key_set_the_same_from_file_and_environment(
    old: str, key: str, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    value = NEW_VALUES[key]
    got = []
    for spelling in (key, old):
        cfg = tmp_path / f"{spelling}.yaml"
        cfg.write_text(yaml.safe_dump({spelling: value}))
        got.append(getattr(load_settings(None, cfg), key))
        with clean_env.context() as m:
            m.setenv(ENV_PREFIX + spelling.upper(), value)
            got.append(getattr(load_settings(), key))
    assert len(set(got)) == 1, got
    assert got[0] != getattr(load_settings(), key)  # the value set is not the default


def test_a_higher_source_wins_whichever_name_each_uses(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    for file_key, env_key in (("poll_gpu_timeout", "gpu_timeout"), ("gpu_timeout", "poll_gpu_timeout")):
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({file_key: "3s"}))
        clean_env.setenv(ENV_PREFIX + env_key.upper(), "4s")
        assert load_settings(None, cfg).poll_gpu_timeout == 4.0, (file_key, env_key)  # the environment beats the file
        flags = settings_from_flags(build_parser().parse_args(["--poll.gpu-timeout", "5s"]))
        assert load_settings(flags, cfg).poll_gpu_timeout == 5.0  # the flag beats both
        clean_env.delenv(ENV_PREFIX + env_key.upper())


def test_a_variable_without_the_prefix_is_not_read(clean_env: pytest.MonkeyPatch) -> None:
    for name in ("LISTEN_ADDRESS", "WEB_LISTEN_ADDRESS", "GPU_TIMEOUT", "POLL_GPU_TIMEOUT"):
        clean_env.setenv(name, "1")
    s = load_settings()
    assert (s.web_listen_address, s.poll_gpu_timeout) == (":9445", 10.0)


@pytest.mark.parametrize(("old", "key"), sorted(RENAMED.items()))
def test_both_names_at_once_are_refused_naming_both(
    old: str, key: str, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({key: NEW_VALUES[key], old: NEW_VALUES[key]}))
    with pytest.raises(ConfigError) as file_error:
        load_settings(None, cfg)
    for needle in (repr(key), repr(old), str(cfg)):
        assert needle in str(file_error.value), (needle, str(file_error.value))
    clean_env.setenv(ENV_PREFIX + key.upper(), NEW_VALUES[key])
    clean_env.setenv(ENV_PREFIX + old.upper(), NEW_VALUES[key])
    with pytest.raises(ConfigError) as env_error:
        load_settings()
    for needle in (ENV_PREFIX + key.upper(), ENV_PREFIX + old.upper()):
        assert needle in str(env_error.value), (needle, str(env_error.value))


@pytest.mark.parametrize("spelling", ["poll_gpu_timeout", "gpu_timeout"])
@pytest.mark.parametrize("source", ["file", "environment"])
def test_a_bad_value_is_named_as_the_user_wrote_it(
    spelling: str, source: str, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    cfg = None
    if source == "file":
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({spelling: "forever"}))
    else:
        clean_env.setenv(ENV_PREFIX + spelling.upper(), "forever")
    with pytest.raises(ConfigError) as e:
        load_settings(None, cfg)
    message = str(e.value)
    # The source it came from, as the user wrote it there (issue 51: only that one).
    where = f"from config file {cfg}" if source == "file" else f"from {ENV_PREFIX + spelling.upper()}"
    for needle in (f"invalid {spelling} ", where, "'forever'"):
        assert needle in message, (needle, message)
    if spelling == "gpu_timeout":  # and the name to write from now on
        assert "poll_gpu_timeout" in message, message


def test_an_unknown_key_is_still_refused_naming_the_keys_of_today(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gpu_timeot": "5s"}))
    with pytest.raises(ConfigError) as e:
        load_settings(None, cfg)
    message = str(e.value)
    assert "'gpu_timeot'" in message and str(cfg) in message, message
    known = message.split("known here:", 1)[1]
    for key in RENAMED.values():
        assert key in known, (key, message)
