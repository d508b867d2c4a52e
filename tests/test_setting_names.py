"""One naming rule between a flag, its config key and its environment variable (issue 34, item 4).

``--poll.interval`` is the key ``poll_interval`` and ``GPU_EXPORTER_POLL_INTERVAL``: the key is the
flag with ``.`` and ``-`` made ``_``, the variable the key's path in capitals, ``__`` between levels,
after ``GPU_EXPORTER_``. Every flag is checked against the rule here, and each one that breaks it
must be named in the README's configuration paragraph (and each one named there must break it), so
the paragraph says the truth about every flag. dcgm-exporter's ``--hpc-job-mapping-dir`` and its
``DCGM_HPC_JOB_MAPPING_DIR`` set ``slurm.job_mapping_dir``, so its users need not rewrite their units.
"""

from __future__ import annotations

import argparse
import json
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.cli import build_parser, main, settings_from_flags
from gpu_exporter.once import UNKNOWN
from gpu_exporter.settings.config import ENV_PREFIX, load_settings

ROOT = Path(__file__).resolve().parent.parent
NOT_SETTINGS = {"--help", "--version", "--config", "--once", "--format"}  # what to do, not how
# A value each flag that takes one accepts (a new flag needs one here).
SAMPLES = {
    "--web.listen-address": "127.0.0.1:9999", "--web.config.file": "/etc/gpu-exporter/web.yml",
    "--web.max-requests": "7", "--poll.interval": "7s", "--poll.static-refresh-interval": "7m",
    "--poll.gpu-timeout": "7s", "--profiling.interval": "7s", "--simulate.gpus": "7", "--log.format": "logfmt",
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
    section = (ROOT / "README.md").read_text().split("### Configuration", 1)[1]
    m = re.search(r"Except (.*?)\. A bad value", section, flags=re.DOTALL)
    assert m, "the README's configuration paragraph no longer lists the flags that break the rule"
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
    assert unlisted == [], f"flags that break the naming rule and that the README does not name: {unlisted}"
    needless = sorted(p for p in patterns if not any(fnmatch(f, p) for f in breaking))
    assert needless == [], f"the README names flags that follow the rule (or do not exist): {needless}"
    # Where a flag sets one setting, the README names it beside the flag.
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
    top = path[0]
    from_flag = getattr(load_settings(given), top)
    # The environment: the key's path in capitals after GPU_EXPORTER_, "__" between levels; a
    # list or mapping below the path as JSON.
    if top == "alerting":
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
    for needle in ("slurm.job_mapping_dir", "--hpc-job-mapping-dir", "DCGM_HPC_JOB_MAPPING_DIR", "is not a directory"):
        assert needle in err, (needle, err)
