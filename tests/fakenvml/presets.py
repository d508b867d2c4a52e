"""Ready-made scenarios, kept as files in ``scenarios/`` for tests, benchmarks and people.

``python -m tests.fakenvml.presets`` rewrites the files from the builders below; a test checks
that the committed files match, so neither drifts from the other.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from .scenario import NOT_SUPPORTED, Counter, Gpu, Scenario
from .values import fabric_health_mask

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
GIB = 1024**3
MIB = 1024**2
_NS = uuid.UUID("6c1f3a52-8f8e-4d0e-9a43-6f7d1f0e2b11")


def gpu_uuid(tag: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NS, f'{tag}/{index}')}"


def mig_uuid(tag: str, gpu: int, index: int) -> str:
    return f"MIG-{uuid.uuid5(_NS, f'{tag}/{gpu}/mig/{index}')}"


HEALTHY_FABRIC = fabric_health_mask(DEGRADED_BW="FALSE", ROUTE_RECOVERY="FALSE", ROUTE_UNHEALTHY="FALSE",
                                    ACCESS_TIMEOUT_RECOVERY="FALSE", INCORRECT_CONFIGURATION="NONE")  # fmt: skip


def h100_sxm(g: Gpu, tag: str, i: int, *, util: int, mem_used: int, power_mw: int, nvlinks: int = 18) -> Gpu:
    """An H100 SXM5 80GB as NVML reports it: passively cooled, Gen5 x16, 18 NVLink links."""
    g.identity("NVIDIA H100 80GB HBM3", gpu_uuid(tag, i))
    g.pci(f"00000000:{0x18 + 0x10 * i:02X}:00.0", device_id=0x233010DE, subsystem_id=0x16C110DE)
    g.serial(f"165232{4000 + i:06d}").minor_number(i)
    g.utilization(util, max(0, util - 45)).memory(81559 * MIB, mem_used, reserved=512 * MIB)
    g.codec(0, 0)
    g.temperature(55 + util // 10, memory=62 + util // 10)
    g.thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.power(power_mw, 700000).energy(Counter(3_600_000_000 + i * 1_000_000, power_mw))
    g.clocks(
        graphics=1980, sm=1980, memory=2619, video=1755, max_graphics=1980, max_sm=1980, max_memory=2619, max_video=1755
    )
    g.pstate(0).clocks_event_reasons()
    g.recovery_action(0)  # a healthy GPU's verdict, on drivers that have field 230 (565 and newer)
    # An HGX board's NVSwitch fabric, registered by nvidia-fabricmanager and healthy in every field the
    # driver reports (no global fabric manager: that is GB200's).
    g.fabric("completed", health_mask=HEALTHY_FABRIC, health_summary="healthy")
    # The byte counters (NVML_FI_DEV_PCIE_COUNT_*) count at tx_kbps / rx_kbps: the fake derives them.
    g.pcie(
        gen=5,
        max_gen=5,
        width=16,
        max_width=16,
        tx_kbps=1_800_000,
        rx_kbps=3_200_000,
        replay=0,
    )
    g.nvlinks(nvlinks)  # field 91: 18 on an H100 SXM
    for link in range(nvlinks):
        g.nvlink(link, True, tx_kib=Counter(0, 1_100_000), rx_kib=Counter(0, 1_050_000))
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.mig_mode(False, max_devices=7)
    # Hopper has GPM. A dense training step keeps most SMs and the tensor pipes busy.
    g.gpm_supported().gpm(**h100_activity(util))
    g.process_utilization(166)
    return g


def b200(g: Gpu, tag: str, i: int, *, util: int, mem_used: int, power_mw: int, name: str = "NVIDIA B200",
         memory_mib: int = 183_359, power_limit_mw: int = 1_000_000) -> Gpu:  # fmt: skip
    """A B200 (Blackwell, HGX B200 board) as its R570/R580 driver reports it: 180 GB HBM3e, Gen5 x16, 18
    NVLink 5 links that count bytes and NVLink 5's errors (fields 202/204, 206-221; not 138/139 or
    161-163), GPM, MIG up to 7, a registered NVSwitch fabric, 1000 W."""
    g.identity(name, gpu_uuid(tag, i)).arch(10)  # NVML_DEVICE_ARCH_BLACKWELL
    g.pci(f"00000000:{0x1B + 0x10 * i:02X}:00.0", device_id=0x290110DE).serial(f"1654924{1000 + i:06d}")
    g.minor_number(i)
    g.utilization(util, max(0, util - 40)).memory(memory_mib * MIB, mem_used, reserved=1024 * MIB).codec(0, 0)
    g.temperature(50 + util // 8, memory=58 + util // 8).thresholds(shutdown=95, slowdown=92, mem_max=98, gpu_max=90)
    g.power(power_mw, power_limit_mw).energy(Counter(7_200_000_000 + i * 1_000_000, power_mw))
    g.clocks(graphics=1965, sm=1965, memory=3996, video=1770, max_graphics=1965, max_sm=1965, max_memory=3996,
             max_video=1770)  # fmt: skip
    g.pstate(0).clocks_event_reasons().recovery_action(0)
    g.fabric("completed", health_mask=HEALTHY_FABRIC, health_summary="healthy")
    g.pcie(gen=5, max_gen=5, width=16, max_width=16, tx_kbps=2_400_000, rx_kbps=4_100_000, replay=0)
    g.nvlinks(18)
    for link in range(18):
        g.nvlink(link, True, tx_kib=Counter(0, 2_200_000), rx_kib=Counter(0, 2_100_000))
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.mig_mode(False, max_devices=7)
    g.gpm_supported().gpm(**h100_activity(util))
    g.process_utilization(166)
    return g


def gb200(g: Gpu, tag: str, i: int, *, util: int, mem_used: int, power_mw: int) -> Gpu:
    """One of a GB200 NVL72 compute tray's four B200s: 186 GB, 1200 W, its NVLink fabric spanning the
    rack, so the global fabric manager's state is reported too (GFM_STATE, nvml.h 13.595 and later),
    and joined to its Grace CPU by NVLink-C2C, whose link counts a few replays."""
    b200(g, tag, i, util=util, mem_used=mem_used, power_mw=power_mw, name="NVIDIA GB200", memory_mib=189_471,
         power_limit_mw=1_200_000)  # fmt: skip
    g.c2c(replay=3 * i)
    return g.fabric("completed", health_summary="healthy", clique_id=32766,
                    health_mask=HEALTHY_FABRIC | fabric_health_mask(GFM_STATE="CONNECTED"))  # fmt: skip


def a100_sxm(g: Gpu, tag: str, i: int, *, util: int = 70, mem_used: int = 40 * GIB) -> Gpu:
    """An A100 SXM4 80GB: 12 NVLink links (NVLink 3), HBM2e with a memory sensor, no GPM (before
    Hopper), passively cooled, instantaneous power (nvml.h: "On GA100 and older architectures,
    instantaneous power is returned")."""
    g.identity("NVIDIA A100-SXM4-80GB", gpu_uuid(tag, i))
    g.pci(f"00000000:{0x07 + 0x08 * i:02X}:00.0", device_id=0x20B210DE).serial(f"15632210{1000 + i:05d}")
    g.utilization(util, util // 3).memory(81920 * MIB, mem_used, reserved=600 * MIB).codec(0, 0)
    g.temperature(40 + util // 5, memory=48 + util // 5).thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.power(90_000 + 3_000 * util, 400_000).energy(Counter(9_000_000, 90_000 + 3_000 * util))
    g.clocks(graphics=1410, sm=1410, memory=1593, video=1275, max_graphics=1410, max_sm=1410, max_memory=1593,
             max_video=1275)  # fmt: skip
    g.pstate(0).clocks_event_reasons().recovery_action(0)
    g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=120_000, rx_kbps=640_000, replay=0)
    g.nvlinks(12)
    for link in range(12):
        g.nvlink(link, True, tx_kib=Counter(0, 200_000), rx_kib=Counter(0, 190_000))
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.mig_mode(False, max_devices=7)
    g.gpm_supported(False).process_utilization(166)
    return g


def l40s(g: Gpu, tag: str, i: int, *, util: int = 60, mem_used: int = 20 * GIB) -> Gpu:
    """An L40S (Ada): no NVLink (field 91 answers 0), GDDR6 without a memory sensor (NVML_FI_DEV_MEMORY_TEMP
    is NOT_SUPPORTED on the Ada L4, DCGM #311), no GPM, passively cooled, power as a 1 s average
    (nvml.h: Ampere and newer except GA100).  Its PCIe byte counters are modelled 32 bits wide: every
    L40S reading posted in dcgm-exporter #721 is below 2^32."""
    g.identity("NVIDIA L40S", gpu_uuid(tag, i))
    g.pci(f"00000000:{0x41 + 0x08 * i:02X}:00.0", device_id=0x26B910DE).serial(f"13242230{2000 + i:05d}")
    g.utilization(util, util // 4).memory(46068 * MIB, mem_used, reserved=480 * MIB).codec(0, 0)
    g.temperature(45 + util // 5).thresholds(shutdown=95, slowdown=92, gpu_max=88)
    g.power(80_000 + 2_500 * util, 350_000).energy(Counter(4_000_000, 80_000 + 2_500 * util))
    g.clocks(graphics=2520, sm=2520, memory=9001, video=1965, max_graphics=2520, max_sm=2520, max_memory=9001,
             max_video=1965)  # fmt: skip
    g.pstate(0).clocks_event_reasons()
    g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=90_000, rx_kbps=410_000, replay=0, counter_bits=32)
    g.nvlinks(0)
    g.ecc(corrected=0, uncorrected=0).remapped_rows()  # nvml.h: remapped rows "For Ampere or newer"
    g.gpm_supported(False).process_utilization(166)
    return g


def t4(g: Gpu, tag: str, i: int, *, util: int = 30, mem_used: int = 4 * GIB) -> Gpu:
    """A Tesla T4 (Turing): no NVLink (field 91 answers 0), GDDR6 without a memory sensor, no row
    remapping (Turing retires pages instead), no GPM, passively cooled, instantaneous power."""
    g.identity("Tesla T4", gpu_uuid(tag, i))
    g.pci(f"00000000:{0x81 + 0x08 * i:02X}:00.0", device_id=0x1EB810DE).serial(f"13241190{3000 + i:05d}")
    g.utilization(util, util // 3).memory(15360 * MIB, mem_used, reserved=250 * MIB).codec(0, 0)
    g.temperature(38 + util // 5).thresholds(shutdown=96, slowdown=93, gpu_max=87)
    g.power(20_000 + 400 * util, 70_000).energy(Counter(1_000_000, 20_000 + 400 * util))
    g.clocks(graphics=1590, sm=1590, memory=5000, video=1470, max_graphics=1590, max_sm=1590, max_memory=5001,
             max_video=1470)  # fmt: skip
    g.pstate(0).clocks_event_reasons()
    g.pcie(gen=3, max_gen=3, width=16, max_width=16, tx_kbps=20_000, rx_kbps=80_000, replay=0)
    g.nvlinks(0)
    g.ecc(corrected=0, uncorrected=0)
    g.gpm_supported(False).process_utilization(166)
    return g


# The 2026 cards of the report's catalogue, as NVML names them and the total memory it reports
# (MiB), the architecture (nvml.h NVML_DEVICE_ARCH_*: 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell) and the
# NVLink links the card has.  Names as nvidia-smi's "Product Name" / DCGM's modelName print them in
# posts: NVIDIA/mig-parted#120 ("NVIDIA H200"), zzc0721/torch-performance-test-data#77 ("NVIDIA H20")
# and #161 ("NVIDIA RTX PRO 6000 Blackwell Server Edition", also bigstack-oss/cubecos#312),
# NVIDIA/dcgm-exporter#317 (modelName "NVIDIA A30"), mayooot/detect-gpu#3 ("NVIDIA A10", Total
# 24146608128 bytes = 23028 MiB, as modal-labs/modal-client#2797 lists it), NVIDIA/k8s-device-plugin#344
# and NVIDIA/DCGM#232 ("NVIDIA A10G", "8722MiB / 23028MiB"), NVIDIA/gpu-admin-tools#4 ("NVIDIA H100
# NVL", "0MiB / 95830MiB"), ollama/ollama#15388 ("Nvidia L40"), NVIDIA/mig-parted#139 (GH200).  H200's
# 143,771 MiB is the catalogue's (NVIDIA's MLPerf system file); the L40's 46,068 MiB is the L40S's
# (modal-client#2797: the same 48 GB GDDR6 board).  Not found in a post, so the spec's GB as NVML
# rounds it: H20 97,871 MiB (96 GB HBM3), A30 24,576 MiB (24 GB HBM2), RTX PRO 6000 97,887 MiB (96 GB
# GDDR7; "97 GB VRAM" in antirez/ds4#256), GH200 97,871 MiB (the 96 GB HBM3 GH200 480GB).
CARDS_2026: dict[str, tuple[int, int, int]] = {
    "NVIDIA H200": (143_771, 9, 18),
    "NVIDIA H20": (97_871, 9, 18),
    "NVIDIA A30": (24_576, 7, 4),  # NVLink bridge, 200 GB/s: 4 NVLink 3 links
    "NVIDIA A10": (23_028, 7, 0),
    "NVIDIA A10G": (23_028, 7, 0),
    "NVIDIA L40": (46_068, 8, 0),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": (97_887, 10, 0),
    "NVIDIA H100 NVL": (95_830, 9, 12),  # NVLink bridge, 600 GB/s: 12 NVLink 4 links
    "NVIDIA GH200 480GB": (97_871, 9, 18),
}


def card_2026(g: Gpu, name: str, tag: str, i: int, *, util: int, mem_used: int, power_mw: int = 300_000) -> Gpu:
    """One of CARDS_2026, passively cooled, healthy, its NVLink links (if any) up with still data
    counters; GPM (Hopper and newer) left at ``util`` as a training step shows it, for the caller to set."""
    memory_mib, arch, links = CARDS_2026[name]
    g.identity(name, gpu_uuid(tag, i)).arch(arch)
    g.pci(f"00000000:{0x11 + 0x08 * i:02X}:00.0").serial(f"16{5230 + arch:04d}{1000 + i:07d}").minor_number(i)
    g.utilization(util, util // 3).memory(memory_mib * MIB, mem_used, reserved=512 * MIB).codec(0, 0)
    g.temperature(40 + util // 4).thresholds(shutdown=92, slowdown=89, gpu_max=87)
    g.power(power_mw, 2 * power_mw).energy(Counter(1_000_000 + i * 1_000, power_mw))
    g.pstate(0).clocks_event_reasons()
    g.pcie(gen=5 if arch >= 9 else 4, max_gen=5 if arch >= 9 else 4, width=16, max_width=16, tx_kbps=50_000,
           rx_kbps=200_000, replay=0)  # fmt: skip
    g.nvlinks(links)
    for link in range(links):
        g.nvlink(link, True, tx_kib=0, rx_kib=0)
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.gpm_supported(arch >= 9)
    if arch >= 9:
        g.gpm(**h100_activity(util))
    return g.process_utilization(166)


def h100_activity(util: int) -> dict[str, float]:
    """GPM percentages in the proportions a transformer training step shows at ``util`` GPU-Util."""
    return {"graphics_util": util, "sm_util": round(util * 0.82, 1), "sm_occupancy": round(util * 0.31, 1),
            "any_tensor_util": round(util * 0.58, 1), "dram_bw_util": round(util * 0.36, 1), "fp64_util": 0,
            "fp32_util": round(util * 0.07, 1), "fp16_util": round(util * 0.03, 1)}  # fmt: skip


def h100_training() -> Scenario:
    s = Scenario(SCENARIO_DIR / "h100-8x-training.scn", comment="8x H100 SXM with NVLink, busy training one job.")
    for i in range(8):
        g = h100_sxm(
            s.add_gpu(), "h100", i, util=94 + i % 5, mem_used=71 * GIB + i * 37 * MIB, power_mw=610000 + 7000 * i
        )
        g.add_process(10_000 + i, 70 * GIB + i * 37 * MIB, name="python3", sm=94 + i % 5, mem=40)
    return s


def workstation() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "workstation-2x-consumer.scn",
        driver_version="550.107.02",
        nvml_version="12.550.107.02",
        cuda_version=12040,
        comment="A workstation with two consumer cards: no ECC, NVLink, energy counter or memory\n"
        "temperature, no serial number, and GPU 1's fan cannot be read.",
    )
    g = s.add_gpu().identity("NVIDIA GeForce RTX 4090", gpu_uuid("ws", 0))
    g.pci("00000000:01:00.0", device_id=0x268410DE).serial(NOT_SUPPORTED).minor_number(0)
    g.utilization(37, 12).memory(24564 * MIB, 9 * GIB, reserved=340 * MIB).codec(8, 3)
    g.temperature(61).thresholds(shutdown=98, slowdown=95, gpu_max=90).fans(45)
    g.power(182000, 450000)
    g.clocks(
        graphics=2520,
        sm=2520,
        memory=10501,
        video=1965,
        max_graphics=3120,
        max_sm=3120,
        max_memory=10501,
        max_video=2415,
    )
    g.pstate(2).clocks_event_reasons("sw_power_cap")
    # GeForce cards: no PCIe byte counters, so the exporter takes the driver's throughput sample.
    g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=95_000, rx_kbps=410_000, replay=3,
           tx_bytes=NOT_SUPPORTED, rx_bytes=NOT_SUPPORTED)  # fmt: skip
    g.add_process(2301, 412 * MIB, kind="graphics", name="/usr/lib/xorg/Xorg")
    g.add_process(2544, 96 * MIB, kind="graphics", name="/usr/bin/gnome-shell")
    g.add_process(8812, 8 * GIB, name="python3")

    g = s.add_gpu().identity("NVIDIA GeForce RTX 3060", gpu_uuid("ws", 1))
    g.pci("00000000:02:00.0", device_id=0x250310DE).serial(NOT_SUPPORTED).minor_number(1)
    g.utilization(0, 0).memory(12288 * MIB, 5 * MIB, reserved=250 * MIB).codec(0, 0)
    g.temperature(34).thresholds(shutdown=98, slowdown=95, gpu_max=93)
    g.set("fan.count", 1).set("fan.0", NOT_SUPPORTED)
    g.power(13000, 170000)
    g.clocks(
        graphics=210, sm=210, memory=405, video=555, max_graphics=2100, max_sm=2100, max_memory=7501, max_video=1950
    )
    g.pstate(8).clocks_event_reasons("gpu_idle")
    g.pcie(gen=1, max_gen=4, width=4, max_width=16, tx_kbps=0, rx_kbps=0, replay=0, tx_bytes=NOT_SUPPORTED,
           rx_bytes=NOT_SUPPORTED)  # fmt: skip
    return s


def pcie_degraded() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "pcie-degraded.scn",
        comment="A Gen4 x16 card whose link trained at Gen1 x8, under load and starved by the bus.",
    )
    g = s.add_gpu().identity("NVIDIA A100-PCIE-40GB", gpu_uuid("pcie", 0))
    g.pci("00000000:3B:00.0", device_id=0x20F110DE).serial("1322321012345").minor_number(0)
    g.utilization(38, 9).memory(40960 * MIB, 30 * GIB, reserved=420 * MIB).codec(0, 0)
    g.temperature(51, memory=58).thresholds(shutdown=90, slowdown=87, mem_max=95, gpu_max=85)
    g.power(118000, 250000).energy(Counter(1_000_000, 118000))
    g.clocks(
        graphics=1410, sm=1410, memory=1215, video=1290, max_graphics=1410, max_sm=1410, max_memory=1215, max_video=1290
    )
    g.pstate(0).clocks_event_reasons()
    # Gen1 x8 carries 250 MB/s x 8 lanes = 2 GB/s per direction; this card moves ~1.9 GB/s.
    g.pcie(
        gen=1,
        max_gen=4,
        width=8,
        max_width=16,
        tx_kbps=310_000,
        rx_kbps=1_860_000,
        replay=Counter(40, 0.5),
    )
    g.ecc(corrected=2, uncorrected=0).remapped_rows(correctable=1)
    g.mig_mode(False)
    g.add_process(7001, 30 * GIB, name="python3")
    return s


def gpu_lost() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "gpu-lost-midway.scn",
        comment="4x H100 where GPU 2 falls off the bus 30 s after the driver is first loaded\n"
        "(XID 79 at the same moment) and stays lost.",
    )
    for i in range(4):
        g = h100_sxm(s.add_gpu(), "lost", i, util=80 + i, mem_used=40 * GIB, power_mw=500000)
        g.add_process(20_000 + i, 39 * GIB, name="python3")
    s.gpu(2).lost(after_s=30).add_xid(79, after_s=30).events_wait_lost()
    return s


def a100_mig() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "a100-mig.scn",
        comment="An A100 80GB with MIG on (3g.40gb + 2g.20gb + 1g.10gb) next to one with MIG off.",
    )
    g = s.add_gpu().identity("NVIDIA A100-SXM4-80GB", gpu_uuid("mig", 0))
    g.pci("00000000:07:00.0", device_id=0x20B210DE).serial("1563221001001").minor_number(0)
    # With MIG on, whole-GPU utilization is not available; memory still is.
    g.memory(81920 * MIB, 52 * GIB, reserved=600 * MIB)
    g.temperature(47, memory=55).thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.power(210000, 400000).energy(Counter(9_000_000, 210000))
    g.clocks(
        graphics=1410, sm=1410, memory=1593, video=1275, max_graphics=1410, max_sm=1410, max_memory=1593, max_video=1275
    )
    g.pstate(0).clocks_event_reasons()
    g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=120_000, rx_kbps=640_000)
    g.nvlinks(12)
    for link in range(12):
        g.nvlink(link, True, tx_kib=Counter(0, 200_000), rx_kib=Counter(0, 190_000))
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.mig_mode(True, max_devices=7)
    for m, (profile, mem, gi) in enumerate((("3g.40gb", 40192, 1), ("2g.20gb", 19968, 5), ("1g.10gb", 9728, 13))):
        mig = g.add_mig(f"NVIDIA A100-SXM4-80GB MIG {profile}", mig_uuid("mig", 0, m), gi, 0)
        mig.memory(mem * MIB, [30 * GIB, 18 * GIB, 4 * GIB][m], reserved=0)
    g.add_process(30_001, 30 * GIB, name="python3", gpu_instance_id=1, compute_instance_id=0)
    g.add_process(30_002, 18 * GIB, name="python3", gpu_instance_id=5, compute_instance_id=0)
    g.add_process(30_003, 4 * GIB, name="tritonserver", gpu_instance_id=13, compute_instance_id=0)

    g = s.add_gpu().identity("NVIDIA A100-SXM4-80GB", gpu_uuid("mig", 1))
    g.pci("00000000:0F:00.0", device_id=0x20B210DE).serial("1563221001002").minor_number(1)
    g.utilization(0, 0).memory(81920 * MIB, 0, reserved=600 * MIB)
    g.temperature(33, memory=36).thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.power(61000, 400000).energy(Counter(2_000_000, 61000))
    g.clocks(
        graphics=210, sm=210, memory=1593, video=795, max_graphics=1410, max_sm=1410, max_memory=1593, max_video=1275
    )
    g.pstate(0).clocks_event_reasons("gpu_idle")
    g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=0, rx_kbps=0)
    g.ecc(corrected=0, uncorrected=0).remapped_rows()
    g.mig_mode(False, max_devices=7)
    return s


def h100_mig() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "h100-8x-mig.scn",
        comment="8x H100 SXM with MIG on, seven 1g.10gb instances each with a process and its own GPM activity.",
    )
    for i in range(8):
        g = h100_sxm(s.add_gpu(), "h100mig", i, util=0, mem_used=60 * GIB, power_mw=450000 + 5000 * i)
        g.unset("util.gpu", "util.memory", "process_util.sample_ms")  # not per GPU in MIG mode
        for k in list(g.values):
            if k.startswith("gpm.") and k != "gpm.supported":
                g.unset(k)
        g.mig_mode(True, max_devices=7)
        for m in range(7):
            gi = 7 + m  # 1g.10gb instances get GPU instance ids 7..13 on an H100
            mig = g.add_mig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", mig_uuid("h100mig", i, m), gi, 0)
            mig.memory(9856 * MIB, (2 + m) * GIB, reserved=0)
            mig.gpm(**h100_activity(15 + 12 * m))
            g.add_process(50_000 + 10 * i + m, (2 + m) * GIB, name="python3", gpu_instance_id=gi, compute_instance_id=0)
    return s


def four_cards() -> Scenario:
    """One each of the cards the fake models, under one driver: what every fleet dashboard meets."""
    s = Scenario(SCENARIO_DIR / "four-cards.scn", comment="An A100, an H100, an L40S and a T4 on driver 550.")
    a100_sxm(s.add_gpu(), "cards", 0)
    h100_sxm(s.add_gpu(), "cards", 1, util=80, mem_used=50 * GIB, power_mw=520_000)
    l40s(s.add_gpu(), "cards", 2)
    t4(s.add_gpu(), "cards", 3)
    return s


def b200_training() -> Scenario:
    s = Scenario(SCENARIO_DIR / "b200-8x-training.scn", comment="8x B200 (HGX B200, NVLink 5), driver 580, training.")
    s.driver(580)
    for i in range(8):
        b200(s.add_gpu(), "b200", i, util=93 + i % 5, mem_used=150 * GIB + i * 41 * MIB, power_mw=880_000 + 9_000 * i)
    return s


def gb200_tray() -> Scenario:
    s = Scenario(
        SCENARIO_DIR / "gb200-nvl72-tray.scn",
        comment="One GB200 NVL72 compute tray: four B200s on the rack's multi-node NVLink fabric, driver 580.",
    )
    s.driver(580)
    for i in range(4):
        gb200(s.add_gpu(), "gb200", i, util=90 + i, mem_used=170 * GIB, power_mw=1_050_000 + 10_000 * i)
    return s


def scale_16() -> Scenario:
    s = Scenario(SCENARIO_DIR / "scale-16x.scn", comment="16 GPUs with 4 processes each, for scale tests.")
    for i in range(16):
        g = h100_sxm(s.add_gpu(), "scale", i, util=50 + 3 * i, mem_used=(20 + 3 * i) * GIB, power_mw=300000 + 20000 * i)
        for p in range(4):
            g.add_process(40_000 + 10 * i + p, 5 * GIB, name="python3")
    return s


PRESETS: dict[str, Callable[[], Scenario]] = {
    "h100-8x-training": h100_training,
    "workstation-2x-consumer": workstation,
    "pcie-degraded": pcie_degraded,
    "gpu-lost-midway": gpu_lost,
    "a100-mig": a100_mig,
    "h100-8x-mig": h100_mig,
    "four-cards": four_cards,
    "scale-16x": scale_16,
    "b200-8x-training": b200_training,
    "gb200-nvl72-tray": gb200_tray,
}


def preset(name: str, path: Path | None = None) -> Scenario:
    """A fresh copy of a ready-made scenario, optionally pointed at another path to edit it."""
    s = PRESETS[name]()
    if path is not None:
        s.path = path
    return s


def main() -> int:
    for build in PRESETS.values():
        print(build().write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
