"""NVIDIA's XID catalogue for Ampere and newer GPUs, as data the XID rule can judge by.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (the page that renders the
downloadable https://docs.nvidia.com/Xid-Catalog.xlsx), read on 2026-12-03 from a stored copy of
that page: its whole "Xids" table (codes 1 to 172), its "Fault Resolution Buckets" table and its
"XID 144-150 Decode" table were read.

Columns used from the "Xids" table: Code, Mnemonic, Applies to A100 / H100 / B100 / GB200 (to
choose the rows), Resolution Bucket (Immediate Action) and Resolution Bucket (Investigatory Action),
both kept verbatim.  Description, Xid 154 linkage and Trigger Conditions are not kept.

Coverage: every row that applies to at least one of A100, H100, B100 or GB200 and whose
Description is not "Unused", with these exceptions, each as the catalogue has it:

* Left out as "Unused" although marked as applying: 14 (ROBUST_CHANNEL_FAKE_ERROR, an injected
  test error) and 108 (NVLINK_REMOTE_TRANSLATION_ERROR).
* Left out as applying to none of the four: every other "Unused" row (61, PMU_BREAKPOINT, among
  them), and 152 / 153 (DLA SMMU error, DLA timeout).
* Left out for want of an Immediate Action bucket: 162 to 172 (power smoothing, confidential
  computing, PCIe fatal timeout, WPR, SEC2 halt, and the DRAM/SRAM detail rows that accompany 48).
  Their rows give no bucket, only, for some, a sentence of guidance; a code left out here is
  treated as unknown by `needs_operator`, that is as needing the operator.
* 142 (ROBUST_CHANNEL_NVENC3_ERROR) has an Immediate Action bucket but an empty Investigatory
  Action cell; it is kept with ``investigatory=""``.

XIDs 144 to 150 (NVLink5) carry WORKFLOW_NVLINK5_ERR here, as in the "Xids" table; the catalogue's
"XID 144-150 Decode" table then refines each of them by sub-code and error status (IGNORE,
RESET_GPU or XID_154_EVAL).  That decode needs the XID message's registers, which this table does
not see, so it is not encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class XidEntry:
    """One row of the catalogue's "Xids" table: the code, its mnemonic and its two resolution buckets."""

    code: int
    mnemonic: str
    immediate: str  # "Resolution Bucket (Immediate Action)", verbatim
    investigatory: str  # "Resolution Bucket (Investigatory Action)", verbatim ("" where the cell is empty)


_APP = "RESTART_APP"
_SUPPORT = "CONTACT_SUPPORT"
_CHECK_APP = "CHECK_APP/CUDA"
_NVLINK5 = "WORKFLOW_NVLINK5_ERR"

CATALOGUE: Mapping[int, XidEntry] = MappingProxyType(
    {
        8: XidEntry(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", _APP, _SUPPORT),
        11: XidEntry(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", _APP, _CHECK_APP),
        13: XidEntry(13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", _APP, "WORKFLOW_XID_13"),
        25: XidEntry(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", _APP, _CHECK_APP),
        31: XidEntry(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", _APP, "WORKFLOW_XID_31"),
        32: XidEntry(32, "ROBUST_CHANNEL_PBDMA_ERROR", _APP, _CHECK_APP),
        37: XidEntry(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", _CHECK_APP),
        38: XidEntry(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", _SUPPORT),
        39: XidEntry(39, "ROBUST_CHANNEL_CE0_ERROR", _APP, _SUPPORT),
        40: XidEntry(40, "ROBUST_CHANNEL_CE1_ERROR", _APP, _SUPPORT),
        41: XidEntry(41, "ROBUST_CHANNEL_CE2_ERROR", _APP, _SUPPORT),
        43: XidEntry(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", _SUPPORT),
        44: XidEntry(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", _SUPPORT),
        45: XidEntry(
            45,
            "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
            "WORKFLOW_XID_45",
            "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)",
        ),
        46: XidEntry(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", _SUPPORT),
        48: XidEntry(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
        54: XidEntry(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS", _SUPPORT),
        60: XidEntry(60, "ROBUST_CHANNEL_SEC2_ERROR", _APP, "INVESTIGATE_SW"),
        62: XidEntry(62, "PMU_HALT_ERROR", "RESET_GPU", _SUPPORT),
        63: XidEntry(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", "IGNORE"),
        64: XidEntry(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", _SUPPORT),
        66: XidEntry(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", "INVESTIGATE_SW"),
        67: XidEntry(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", _SUPPORT),
        68: XidEntry(68, "ROBUST_CHANNEL_NVDEC0_ERROR", _APP, _SUPPORT),
        69: XidEntry(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", _APP, _CHECK_APP),
        70: XidEntry(70, "ROBUST_CHANNEL_CE3_ERROR", _APP, _SUPPORT),
        71: XidEntry(71, "ROBUST_CHANNEL_CE4_ERROR", _APP, _SUPPORT),
        72: XidEntry(72, "ROBUST_CHANNEL_CE5_ERROR", _APP, _SUPPORT),
        74: XidEntry(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", _SUPPORT),
        75: XidEntry(75, "ROBUST_CHANNEL_CE6_ERROR", _APP, _SUPPORT),
        76: XidEntry(76, "ROBUST_CHANNEL_CE7_ERROR", _APP, _SUPPORT),
        77: XidEntry(77, "ROBUST_CHANNEL_CE8_ERROR", _APP, _SUPPORT),
        78: XidEntry(78, "VGPU_START_ERROR", "UPDATE_SWFW", "UPDATE_SWFW"),
        79: XidEntry(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", _SUPPORT),
        80: XidEntry(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", _APP, _CHECK_APP),
        82: XidEntry(82, "ROBUST_CHANNEL_NVJPG0_ERROR", _APP, _SUPPORT),
        83: XidEntry(83, "ROBUST_CHANNEL_NVDEC1_ERROR", _APP, _SUPPORT),
        84: XidEntry(84, "ROBUST_CHANNEL_NVDEC2_ERROR", _APP, _SUPPORT),
        85: XidEntry(85, "ROBUST_CHANNEL_CE9_ERROR", _APP, _SUPPORT),
        86: XidEntry(86, "ROBUST_CHANNEL_OFA0_ERROR", _APP, _SUPPORT),
        88: XidEntry(88, "ROBUST_CHANNEL_NVDEC3_ERROR", _APP, _SUPPORT),
        89: XidEntry(89, "ROBUST_CHANNEL_NVDEC4_ERROR", _APP, _SUPPORT),
        92: XidEntry(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", _SUPPORT),
        93: XidEntry(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", _SUPPORT),
        94: XidEntry(94, "ROBUST_CHANNEL_CONTAINED_ERROR", _APP, "IGNORE (sympathetic)"),
        95: XidEntry(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "IGNORE (sympathetic)"),
        96: XidEntry(96, "ROBUST_CHANNEL_NVDEC5_ERROR", _APP, _SUPPORT),
        97: XidEntry(97, "ROBUST_CHANNEL_NVDEC6_ERROR", _APP, _SUPPORT),
        98: XidEntry(98, "ROBUST_CHANNEL_NVDEC7_ERROR", _APP, _SUPPORT),
        99: XidEntry(99, "ROBUST_CHANNEL_NVJPG1_ERROR", _APP, _SUPPORT),
        100: XidEntry(100, "ROBUST_CHANNEL_NVJPG2_ERROR", _APP, _SUPPORT),
        101: XidEntry(101, "ROBUST_CHANNEL_NVJPG3_ERROR", _APP, _SUPPORT),
        102: XidEntry(102, "ROBUST_CHANNEL_NVJPG4_ERROR", _APP, _SUPPORT),
        103: XidEntry(103, "ROBUST_CHANNEL_NVJPG5_ERROR", _APP, _SUPPORT),
        104: XidEntry(104, "ROBUST_CHANNEL_NVJPG6_ERROR", _APP, _SUPPORT),
        105: XidEntry(105, "ROBUST_CHANNEL_NVJPG7_ERROR", _APP, _SUPPORT),
        106: XidEntry(106, "SMBPBI_TEST_MESSAGE", "IGNORE", "IGNORE"),
        107: XidEntry(107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE", "IGNORE"),
        109: XidEntry(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", _SUPPORT),
        110: XidEntry(110, "SEC_FAULT_ERROR", "RESET_GPU", "INVESTIGATE_SW"),
        119: XidEntry(119, "GSP_RPC_TIMEOUT", "RESET_GPU", "INVESTIGATE_SW"),
        120: XidEntry(120, "GSP_ERROR", "RESET_GPU", "INVESTIGATE_SW"),
        121: XidEntry(121, "C2C_ERROR", "IGNORE", _SUPPORT),
        126: XidEntry(126, "ROBUST_CHANNEL_CE10_ERROR", _APP, _SUPPORT),
        127: XidEntry(127, "ROBUST_CHANNEL_CE11_ERROR", _APP, _SUPPORT),
        128: XidEntry(128, "ROBUST_CHANNEL_CE12_ERROR", _APP, _SUPPORT),
        129: XidEntry(129, "ROBUST_CHANNEL_CE13_ERROR", _APP, _SUPPORT),
        130: XidEntry(130, "ROBUST_CHANNEL_CE14_ERROR", _APP, _SUPPORT),
        131: XidEntry(131, "ROBUST_CHANNEL_CE15_ERROR", _APP, _SUPPORT),
        132: XidEntry(132, "ROBUST_CHANNEL_CE16_ERROR", _APP, _SUPPORT),
        133: XidEntry(133, "ROBUST_CHANNEL_CE17_ERROR", _APP, _SUPPORT),
        134: XidEntry(134, "ROBUST_CHANNEL_CE18_ERROR", _APP, _SUPPORT),
        135: XidEntry(135, "ROBUST_CHANNEL_CE19_ERROR", _APP, _SUPPORT),
        136: XidEntry(136, "ALI_TRAINING_FAIL", "RESET_GPU", "INVESTIGATE_LINK_SI"),
        137: XidEntry(137, "NVLINK_PRIV_ERR", "IGNORE", "XID_137_FLOW"),
        139: XidEntry(139, "ROBUST_CHANNEL_OFA1_ERROR", _APP, _SUPPORT),
        140: XidEntry(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", _SUPPORT),
        141: XidEntry(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", _SUPPORT),
        142: XidEntry(142, "ROBUST_CHANNEL_NVENC3_ERROR", _SUPPORT, ""),
        143: XidEntry(143, "GPU_INIT_ERROR", "RESET_GPU", _SUPPORT),
        144: XidEntry(144, "NVLINK_SAW_ERROR", _NVLINK5, _NVLINK5),
        145: XidEntry(145, "NVLINK_RLW_ERROR", _NVLINK5, _NVLINK5),
        146: XidEntry(146, "NVLINK_TLW_ERROR", _NVLINK5, _NVLINK5),
        147: XidEntry(147, "NVLINK_TREX_ERROR", _NVLINK5, _NVLINK5),
        148: XidEntry(148, "NVLINK_NVLPW_CTRL_ERROR", _NVLINK5, _NVLINK5),
        149: XidEntry(149, "NVLINK_NETIR_ERROR", _NVLINK5, _NVLINK5),
        150: XidEntry(150, "NVLINK_MSE_ERROR", _NVLINK5, _NVLINK5),
        151: XidEntry(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", _SUPPORT),
        154: XidEntry(154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154", "N/A Informational only regarding another Xid"),
        155: XidEntry(155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", "INVESTIGATE_SW_USER"),
        156: XidEntry(156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", "IGNORE"),
        157: XidEntry(157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", _SUPPORT),
        158: XidEntry(158, "GPU_FATAL_TIMEOUT", "RESET_GPU", _SUPPORT),
        159: XidEntry(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
        160: XidEntry(160, "CHANNEL_RETIREMENT_EVENT", "IGNORE", "INVESTIGATE_SW"),
        161: XidEntry(161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", "INVESTIGATE_SW"),
    }
)

# What the operator does for each Immediate Action bucket of CATALOGUE, in our words (the catalogue's
# "Fault Resolution Buckets" table has the full steps).
ACTION_ADVICE: Mapping[str, str] = MappingProxyType(
    {
        "RESTART_APP": "restart the application; the GPU needs no reset",
        "IGNORE": "nothing to do now; watch for a repeat or for a companion XID",
        "RESET_GPU": "reset the GPU (SIGUSR1 to gpu-exporter, then nvidia-smi -r -i <gpu>) once its jobs have stopped",
        "RESTART_BM": "reboot the node",
        "RESTART_VM": "restart the VM that owns the GPU",
        "CONTACT_SUPPORT": "open a case with your hardware vendor or NVIDIA support",
        "CHECK_MECHANICALS": "check the GPU's seating and its power and other connectors",
        "UPDATE_SWFW": "update the driver and firmware; for vGPU, match guest and host drivers",
        "CHECK_UVM": "reset the GPU if UVM or vGPU is in use on it; otherwise nothing to do",
        "XID_154": "do what the accompanying XID 154 message names as the recovery action",
        "WORKFLOW_XID_45": "alone: restart Fabric Manager; with other XIDs: handle those instead",
        "WORKFLOW_XID_48": "drain and reset the GPU (with 63/64), or reset it; run field diagnostics if it recurs",
        "WORKFLOW_NVLINK_ERR": "decode the XID's registers per the catalogue; reset the GPU or reboot, reseat links",
        "WORKFLOW_NVLINK5_ERR": "decode the XID's sub-code and status per the catalogue; often a GPU reset",
    }
)

# Immediate buckets after which the workload owner, not the operator, has something to do (or nobody).
_NO_OPERATOR = frozenset({"RESTART_APP", "IGNORE"})


def needs_operator(code: int) -> bool:
    """Whether an XID of this code calls for the operator: its Immediate Action is neither restarting the
    application nor ignoring it."""
    entry = CATALOGUE.get(code)
    if entry is None:
        # Not in the table: a code the catalogue has no bucket for, marks unused, or that a newer driver
        # added after it was read.  An XID is the driver reporting a fault; without a bucket saying it is
        # harmless, calling the operator costs a look while staying quiet could hide a failing GPU.
        return True
    return entry.immediate not in _NO_OPERATOR


# WORKFLOW_XID_45 is left out of the default alert: the catalogue says 45 also follows ordinary
# aborts (a Ctrl-C, a kill) and other XIDs, whose own buckets say what to do; alone it means
# restarting Fabric Manager.  A user who wants it adds 45 to rules.GpuXidError.codes.
_NOT_BY_DEFAULT = frozenset({45})


def operator_xids() -> list[int]:
    """The XIDs GpuXidError alerts on by default: those whose Immediate Action needs the operator."""
    return sorted(c for c in CATALOGUE if needs_operator(c) and c not in _NOT_BY_DEFAULT)


def advice(code: int) -> str:
    """What to do for an XID, in a few words, from its Immediate Action bucket."""
    entry = CATALOGUE.get(code)
    if entry is None:
        return "not in NVIDIA's XID catalogue as read: see the driver's message and the catalogue"
    return ACTION_ADVICE.get(entry.immediate, f"NVIDIA's catalogue says {entry.immediate}")


def alert_table() -> str:
    """docs/troubleshooting.md's table: each XID GpuXidError alerts on by default, and what to do."""
    rows = ["| XID | mnemonic | NVIDIA's immediate action | what to do |", "|---|---|---|---|"]
    for code in operator_xids():
        e = CATALOGUE[code]
        rows.append(f"| {code} | `{e.mnemonic}` | `{e.immediate}` | {advice(code)} |")
    return "\n".join(rows) + "\n"
