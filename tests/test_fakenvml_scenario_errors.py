"""A malformed scenario makes nvmlInit fail loudly, naming the file and line; never silent zeros."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HEADER = "[system]\ndriver_version = 550.54.15\n"


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("[gpu 0]\nutil.gpu = ninety\nend\n", 4, "key 'util.gpu' needs a number"),
        ("[gpu 0]\nutil.gpuu = 90\nend\n", 4, "unknown key 'util.gpuu'"),
        ("[gpu 0]\nfan.0 = !NOT_SUPORTED\nend\n", 4, "unknown NVML error 'NOT_SUPORTED'"),
        ("[gpu 0]\nutil.gpu = 90 percent\nend\n", 4, "trailing text"),
        ("[gpu 0]\nenergy_mj = 10 +5/min\nend\n", 4, "bad rate"),
        ("[gpu 0]\nutil.gpu 90\nend\n", 4, "expected 'key = value'"),
        ("[gpus 0]\nend\n", 3, "unknown section [gpus 0]"),
        ("[gpu 1]\nend\n", 3, "expected [gpu 0]"),
        ("[gpu 0]\n[gpu 0]\nend\n", 4, "duplicate section [gpu 0]"),
        ("[gpu 0]\nutil.gpu = 1\nutil.gpu = 2\nend\n", 5, "set twice"),
        ("[gpu 0]\ndriver_version = 1\nend\n", 4, "does not belong in this section"),
        ("[gpu 0 mig 0]\nend\n", 3, "comes before its [gpu 0] section"),
        ("[gpu 0]\nprocess = compute pid=12\nend\n", 4, "needs pid= and used="),
        ("[gpu 0]\nprocess = daemon pid=12 used=1\nend\n", 4, "must start with 'compute' or 'graphics'"),
        ("[gpu 0]\nxid = seventy-nine\nend\n", 4, "xid"),
        ("[gpu 0]\nstate = gone\nend\n", 4, "state must be 'ok', 'lost' or 'reset_required'"),
        ("[gpu 0]\nutil.gpu = 90\n", 5, "missing the final 'end' line"),
        ("[gpu 0]\nend\nutil.gpu = 1\n", 5, "text after the 'end' line"),
    ],
)
def test_malformed_line_fails_init_with_file_and_line(
    nvml: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    body: str,
    line: int,
    message: str,
) -> None:
    N = nvml
    path = tmp_path / "broken.scn"
    path.write_text(HEADER + body)
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlInit()
    err = capfd.readouterr().err
    assert f"{path}:{line}:" in err, err
    assert message in err, err


def test_missing_scenario_file(
    nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    N = nvml
    path = tmp_path / "nope.scn"
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlInit()
    assert f"{path}: cannot read the scenario file" in capfd.readouterr().err


def test_unset_scenario_variable(nvml: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    N = nvml
    monkeypatch.delenv("FAKE_NVML_SCENARIO")
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlInit()
    assert "FAKE_NVML_SCENARIO is not set" in capfd.readouterr().err


def test_a_minimal_valid_file(nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    N = nvml
    path = tmp_path / "ok.scn"
    path.write_text("# comment\n\n[system]\ndriver_version = 1.2.3\n[gpu 0]\n  name =  Tesla T4  \nend\n\n")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    N.nvmlInit()
    assert N.nvmlSystemGetDriverVersion() == "1.2.3"
    assert N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(0)) == "Tesla T4"
    with pytest.raises(N.NVMLError_NotSupported):  # not in the file
        N.nvmlSystemGetCudaDriverVersion()
