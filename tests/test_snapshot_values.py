"""What every consumer of a snapshot (metrics, rules, the books) derives from it the same way: the
PCIe link's speed and whether anyone holds the GPU."""

from __future__ import annotations

import pytest

from gpu_exporter.snapshot import GpuReading, MigReading, ProcessReading, holds_memory, pcie_link_bytes_per_second


@pytest.mark.parametrize(
    ("generation", "width"),
    [(None, 16), (5, None), (None, None), (7, 16), (5, 0)],
    ids=["generation unknown", "width unknown", "neither known", "a generation newer than the table", "no lanes"],
)
def test_a_link_speed_that_cannot_be_known_is_left_out_not_guessed_nor_zero(generation: int | None,
                                                                            width: int | None) -> None:  # fmt: skip
    assert pcie_link_bytes_per_second(generation, width) is None


def test_a_link_speed_is_lanes_times_the_generations_usable_rate() -> None:
    assert pcie_link_bytes_per_second(5, 1) == pytest.approx(32e9 * 128 / 130 / 8)  # 3.94 GB/s per Gen5 lane
    assert pcie_link_bytes_per_second(5, 16) == pytest.approx(16 * pcie_link_bytes_per_second(5, 1))  # type: ignore[operator]
    assert pcie_link_bytes_per_second(1, 1) == pytest.approx(2.5e9 * 8 / 10 / 8)  # 8b/10b encoding


def mig_gpu(used: int | None) -> GpuReading:
    mig = MigReading(index=0, uuid="MIG-0", profile="1g.10gb", gpu_instance_id=1, compute_instance_id=0,
                     processes=(ProcessReading(100, "python3", used),))  # fmt: skip
    return GpuReading(index=0, uuid="GPU-0", up=True, migs=(mig,))


@pytest.mark.parametrize(("used", "held"), [(10 * 1024**3, True), (1, True), (0, False), (None, False)])
def test_a_process_in_a_mig_device_holds_its_gpu_only_with_memory(used: int | None, held: bool) -> None:
    """A job in a MIG slice holds the whole card for the idle alerts and the books, as one on the card
    would; a process without memory (or whose memory the driver does not give) holds nothing."""
    assert holds_memory(mig_gpu(used)) is held
