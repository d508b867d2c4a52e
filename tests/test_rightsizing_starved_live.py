"""Issue 48, items 5 and 6, end to end: the real daemon on the fake NVML, a real Prometheus and a
real VictoriaMetrics scraping it every second for a minute, and ``gpu-exporter report`` asking each.

One node of H100 PCIe cards without NVLink (field 91 answers 0: gpu_nvlink_links 0, and no NVLink
traffic series), each held by a Slurm job of its own (GPU index: case):

- 0: plain.  20% SM activity, 10% DRAM bandwidth, 30 GiB.  Its NVLink counters are absent because it
  has no links, which the report used to read as "unknown" and refuse every card without NVLink: it
  fits an L40S (45 GiB, 362 TFLOPS, 864 GB/s) and is told so.
- 1: starved.  Its link trained at Gen3 x8 (7.9 GB/s each way) where card and slot allow Gen5 x16
  (63.0 GB/s); RX at 96% of it (7,385,000 KB/s); 33% SM activity.  It was told of an L40S "at least
  as fast"; now it is told to fix the link, with the figures, and the link-bound hours are priced.
- 2: busy.  90% SM activity: no cheaper card keeps up, and a note says so.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import assert_mentions
from tests.fakenvml.presets import GIB, gpu_uuid, h100_sxm
from tests.fakenvml.scenario import Scenario
from tests.rightsizing_live_helpers import (
    ENGINES,
    ME,
    a_minute_in_both_stores,
    advice,
    config,
    printed,
    reasons,
    report,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PRICING: dict[str, Any] = {"currency": "USD", "models": {"H100": 2.50, "L40S": 1.00, "L4": 0.50}}
PLAIN, STARVED, BUSY = "0", "1", "2"
GPUS = 3
# Gen3 x8: 8 GT/s x 128/130 / 8 x 8 lanes = 7.877 GB/s each way; 96% of it is 7.562 GB/s, which the
# driver's throughput sample gives in KB/s (x 1024, as the exporter reads it).
RX_KBPS = 7_385_000


def h100_pcie(s: Scenario, i: int, sm: int, dram: int, pid: int) -> Any:
    g = h100_sxm(s.add_gpu(), "starved", i, util=sm, mem_used=30 * GIB, power_mw=200_000, nvlinks=0)
    g.identity("NVIDIA H100 PCIe", gpu_uuid("starved", i))
    g.gpm(sm_util=sm, graphics_util=sm + 5, any_tensor_util=sm * 3 // 4, dram_bw_util=dram, fp64_util=0,
          fp32_util=3, fp16_util=1)  # fmt: skip
    g.add_process(pid, 30 * GIB, name="python3", sm=sm)
    return g


def node(path: Path, pids: list[int]) -> Scenario:
    s = Scenario(path, comment="issue 48: a plain H100 without NVLink, one starved by its link, one busy")
    h100_pcie(s, 0, 20, 10, pids[0])
    h100_pcie(s, 1, 33, 12, pids[1]).pcie(gen=3, max_gen=5, width=8, max_width=16, tx_kbps=300_000, rx_kbps=RX_KBPS,
                                          replay=0)  # fmt: skip
    h100_pcie(s, 2, 90, 60, pids[2])
    return s


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("starved")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(GPUS)]
    try:
        s = node(tmp / "node.scn", [p.pid for p in sleepers])
        s.write()
        cfg = config(tmp, PRICING, {PLAIN: "480", STARVED: "481", BUSY: "482"})
        with a_minute_in_both_stores(s.path, cfg, tmp, GPUS) as live:
            yield live
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def docs(live: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {engine: report(live, engine) for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_card_with_no_nvlink_links_fits_an_l40s(docs: dict[str, dict[str, Any]], engine: str) -> None:
    r = advice(docs[engine], PLAIN)
    assert r is not None, (reasons(docs[engine]), [g["notes"] for g in docs[engine]["gpus"]])
    assert (r["kind"], r["suggested"]) == ("card", "L40S"), r["reason"]
    assert "NVLink traffic is unknown" not in r["reason"]
    assert_mentions(r["reason"], "job 480", "20% SM activity", "10% DRAM bandwidth", "an L40S", "$1.00/h",
                    "$2.50/h", "$1,095/month")  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_a_starved_link_is_named_with_its_figures_and_fixed_before_any_card(
    docs: dict[str, dict[str, Any]], engine: str
) -> None:
    doc = docs[engine]
    r = advice(doc, STARVED)
    assert r is not None, reasons(doc)
    assert (r["kind"], r["suggested"], r["saving_per_month"]) == ("link", "fix the PCIe link", None), r["reason"]
    assert "L40S" not in r["reason"]
    assert_mentions(r["reason"], "Gen3 x8 (7.9 GB/s each way)", "Gen5 x16 (63.0 GB/s each way)", "RX 96%",
                    "trained below its maximum", "33% SM activity", "reseat the card", "BIOS", "riser", "slot",
                    "link-bound")  # fmt: skip
    (row,) = [g for g in doc["gpus"] if g["gpu"] == STARVED]
    held = row["busy_hours"] + row["allocated_idle_hours"]
    # Link-bound nearly all the time it was held (a step at either end may fall outside), at its price.
    assert 0.8 * held <= row["link_bound_hours"] <= held + 1e-6, row
    assert row["link_bound_cost"] == pytest.approx(row["link_bound_hours"] * 2.5, abs=1e-4)
    assert doc["totals"]["link_bound_hours"] == row["link_bound_hours"]
    others = [g["link_bound_hours"] for g in doc["gpus"] if g["gpu"] != STARVED]
    assert others == [0.0, 0.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_busy_gpu_without_advice_says_why(live: dict[str, Any], docs: dict[str, dict[str, Any]],
                                            engine: str) -> None:  # fmt: skip
    doc = docs[engine]
    assert advice(doc, BUSY) is None
    (row,) = [g for g in doc["gpus"] if g["gpu"] == BUSY]
    (note,) = row["notes"]
    assert note.startswith("no cheaper card fits: of the ") and "slower at its bursts" in note, note
    table = printed(live, engine)
    assert f"GPU {BUSY} on node-a: {note}" in table
    assert "Link-bound " in table and "-> fix the PCIe link, then size it again" in table


def test_both_engines_give_the_same_advice(docs: dict[str, dict[str, Any]]) -> None:
    p, v = ([(r["kind"], r["gpu"], r["suggested"], r["saving_per_month"]) for r in docs[e]["recommendations"]]
            for e in ENGINES)  # fmt: skip
    assert p == v


def code_blocks(path: Path, after: str) -> list[str]:
    """The fenced blocks of a document from the line holding ``after`` on."""
    text = path.read_text().split(after, 1)[1]
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("\n")]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_docs_show_what_the_report_printed(live: dict[str, Any], engine: str) -> None:
    """docs/cost.md's starved link and GPU left without advice are the report's own text."""
    lines = {re.sub(rf"\bof {re.escape(ME)}\b", "of alice", line) for line in printed(live, engine).splitlines()}
    examples = code_blocks(ROOT / "docs" / "cost.md", "**A starved link, and a GPU left without advice**")[:2]
    assert len(examples) == 2
    for block in examples:
        for line in block.splitlines():
            assert line in lines, f"not printed by the report: {line!r}"
