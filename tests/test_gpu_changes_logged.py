"""The daemon logs a GPU that is lost, comes back, or reports an XID: once each, at warning, so the
README's ``journalctl -o cat -u gpu-exporter | jq 'select(.level != "info")'`` shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml.presets import preset

pytestmark = pytest.mark.integration


def test_the_daemon_warns_once_of_a_lost_gpu_its_xid_and_its_return(fake_nvml_lib: Path, tmp_path: Path) -> None:
    s = preset("h100-8x-training", tmp_path / "node.scn")
    s.gpus = s.gpus[:2]
    s.gpu(1).lost(after_s=3, until_s=7).add_xid(79, after_s=2)  # fell off the bus, then back
    s.write()
    with run_daemon(s.path, "--poll.interval", "1s") as d:
        wait_for(lambda: any(e.get("event") == "gpu_back" for e in d.log), timeout=60, what="gpu_back logged")
        log = list(d.log)
    changes = [(e["event"], e["gpu"], e.get("xid")) for e in log if str(e.get("event", "")).startswith("gpu_")
               and e.get("level") != "info"]  # fmt: skip
    # The XID and the loss may share a poll on a slow machine: their order is not the point.
    assert sorted(changes[:2], key=str) == [("gpu_lost", 1, None), ("gpu_xid", 1, 79)], log
    assert changes[2:] == [("gpu_back", 1, None)], log
    lost = next(e for e in log if e.get("event") == "gpu_lost")
    assert lost["level"] == "warning" and str(lost["uuid"]).startswith("GPU-") and lost["error"], lost
