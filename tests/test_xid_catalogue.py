"""The XID table taken from NVIDIA's XID catalogue (gpu_exporter/alerting/xid_catalogue.py) holds together.

Rows quoted below are from https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read on
2026-12-03, as "Code | Mnemonic | Description | A100 | H100 | B100 | GB200 | Immediate | Investigatory".
"""

from __future__ import annotations

import pytest

from gpu_exporter.alerting.xid_catalogue import ACTION_ADVICE, CATALOGUE, XidEntry, needs_operator

# The GpuXidError rule's fixed list until now (gpu_exporter/alerting/settings.py, XidRule.codes).
TODAYS_CODES = [48, 63, 64, 74, 79, 92, 94, 95]


def test_every_entry_is_filed_under_its_own_code() -> None:
    assert CATALOGUE, "the table is empty"
    for key, entry in CATALOGUE.items():
        assert isinstance(entry, XidEntry)
        assert entry.code == key, entry
        assert entry.mnemonic and entry.mnemonic == entry.mnemonic.strip(), entry
        assert entry.immediate and entry.immediate == entry.immediate.strip(), entry


def test_every_immediate_bucket_has_advice_and_every_advice_a_bucket() -> None:
    used = {entry.immediate for entry in CATALOGUE.values()}
    assert sorted(used - ACTION_ADVICE.keys()) == []
    assert sorted(ACTION_ADVICE.keys() - used) == [], "advice for a bucket no entry uses"
    assert all(advice.strip() for advice in ACTION_ADVICE.values())


def test_the_table_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        CATALOGUE[1] = XidEntry(1, "X", "IGNORE", "IGNORE")  # type: ignore[index]
    with pytest.raises(AttributeError):
        CATALOGUE[79].immediate = "IGNORE"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("code", "mnemonic", "immediate", "investigatory"),
    [
        # 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | GPU has fallen off the bus | YES | YES | YES | YES |
        #      RESTART_BM | CONTACT_SUPPORT
        (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT"),
        # 48 | ROBUST_CHANNEL_GPU_ECC_DBE | Double Bit ECC Error | YES | YES | YES | YES |
        #      WORKFLOW_XID_48 | WORKFLOW_XID_48
        (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
        # 94 | ROBUST_CHANNEL_CONTAINED_ERROR | Contained memory error | YES | YES | YES | YES |
        #      RESTART_APP | IGNORE (sympathetic)
        (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", "IGNORE (sympathetic)"),
        # 95 | ROBUST_CHANNEL_UNCONTAINED_ERROR | Uncontained memory error | YES | YES | YES | YES |
        #      RESET_GPU | IGNORE (sympathetic)
        (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "IGNORE (sympathetic)"),
        # 63 | INFOROM_DRAM_RETIREMENT_EVENT | GPU memory remapping event | YES | YES | YES | YES | IGNORE | IGNORE
        (63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", "IGNORE"),
        # 74 | NVLINK_ERROR | NVLINK Error | YES | YES | NO | NO | WORKFLOW_NVLINK_ERR | CONTACT_SUPPORT
        (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
        # 119 | GSP_RPC_TIMEOUT | GSP RPC Timeout | YES | YES | YES | YES | RESET_GPU | INVESTIGATE_SW
        (119, "GSP_RPC_TIMEOUT", "RESET_GPU", "INVESTIGATE_SW"),
        # 121 | C2C_ERROR | C2C Error | NO | NO | NO | YES | IGNORE | CONTACT_SUPPORT
        (121, "C2C_ERROR", "IGNORE", "CONTACT_SUPPORT"),
        # 154 | GPU_RECOVERY_ACTION_CHANGED | GPU Recovery Action Changed | YES | YES | YES | YES |
        #       XID_154 | N/A Informational only regarding another Xid
        (154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154", "N/A Informational only regarding another Xid"),
    ],
)
def test_entries_match_the_catalogue_rows(code: int, mnemonic: str, immediate: str, investigatory: str) -> None:
    assert CATALOGUE[code] == XidEntry(code, mnemonic, immediate, investigatory)


def test_rows_the_catalogue_marks_unused_or_not_applicable_are_left_out() -> None:
    # 61 | PMU_BREAKPOINT | Unused | NO | NO | NO | NO | CONTACT_SUPPORT | N/A; Unused
    # 14 | ROBUST_CHANNEL_FAKE_ERROR | Unused | YES | YES | YES | YES | IGNORE | CONTACT_SUPPORT
    # 152 | ROBUST_CHANNEL_DLA_SMMU_ERROR | DLA SMMU Error | NO | NO | NO | NO | IGNORE | CONTACT_SUPPORT
    for code in (1, 14, 61, 108, 152, 153):
        assert code not in CATALOGUE, code


def test_todays_fixed_list_is_all_in_the_table() -> None:
    assert [code for code in TODAYS_CODES if code not in CATALOGUE] == []


def test_needs_operator_on_todays_fixed_list() -> None:
    # Judged by the catalogue's Immediate Action, three codes of today's list need no operator:
    # 63 and 92 are IGNORE (a row remapping done; a high single-bit rate, corrected), and 94 is
    # RESTART_APP (the error was contained to one application).  The others need a reset, a reboot
    # or a workflow that may end in one.
    judged = {code: needs_operator(code) for code in TODAYS_CODES}
    assert judged == {48: True, 63: False, 64: True, 74: True, 79: True, 92: False, 94: False, 95: True}


@pytest.mark.parametrize("code", [0, 9999, -1, 61, 168])
def test_a_code_not_in_the_table_needs_the_operator(code: int) -> None:
    assert code not in CATALOGUE
    assert needs_operator(code) is True


def test_needs_operator_follows_the_immediate_bucket() -> None:
    for code, entry in CATALOGUE.items():
        assert needs_operator(code) is (entry.immediate not in ("RESTART_APP", "IGNORE")), entry
    assert needs_operator(13) is False  # 13 | ... | Graphics Engine Exception | ... | RESTART_APP | WORKFLOW_XID_13
    assert needs_operator(43) is False  # 43 | ... | GPU stopped processing | ... | IGNORE | CONTACT_SUPPORT
    assert needs_operator(151) is True  # 151 | ROBUST_CHANNEL_KEY_ROTATION_ERROR | ... | RESTART_VM | CONTACT_SUPPORT
