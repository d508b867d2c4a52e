"""Names that tenants choose (process names, user names, cgroup paths, pod names) reach /metrics,
--once and the logs as text that is always valid, bounded and inert (issue 28, points 1, 3, 4, 10
and 11's long names).  Each case is one a local user or a pod can cause on a shared host."""

from __future__ import annotations

import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpu_exporter import untrusted
from gpu_exporter.kubernetes.attribution import read_proc
from gpu_exporter.once import as_json, as_table, exit_status, findings
from gpu_exporter.serving.exposition import render_text
from gpu_exporter.serving.metrics import RenderOptions, SnapshotCollector
from gpu_exporter.sources import procfs
from tests.exporter_helpers import make_poller, samples_of
from tests.fakenvml import Scenario
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

GIB = 1024**3
# What the kernel keeps of "éééééééé" (16 bytes) in a 15-byte task name: the last character cut in two.
CUT_NAME = b"\xc3\xa9" * 7 + b"\xc3"


def named_process(comm: bytes) -> subprocess.Popen[bytes]:
    """A sleeping process that named itself ``comm`` with prctl(PR_SET_NAME), as any local user can."""
    code = (
        "import ctypes, sys, time\n"
        f"ctypes.CDLL(None).prctl(15, ctypes.c_char_p({comm!r}), 0, 0, 0)\n"
        "sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    return proc


@pytest.fixture
def cut_name_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = named_process(CUT_NAME)
    try:
        assert Path(f"/proc/{proc.pid}/comm").read_bytes() == CUT_NAME + b"\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_process_name_that_is_not_utf8_costs_only_its_own_label(
    scenario: Scenario, nvml: Any, cut_name_process: subprocess.Popen[bytes]
) -> None:
    g = (
        scenario.add_gpu()
        .identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
        .utilization(50, 10)
        .memory(80 * GIB, 10 * GIB)
        .temperature(60)
    )
    g.add_process(cut_name_process.pid, 3 * GIB)
    scenario.write()
    poller, _ = make_poller()
    snap = poller.poll()
    poller.close()
    (gpu,) = snap.gpus
    assert gpu.up, gpu.error  # before: UnicodeDecodeError made the GPU "lost"
    s = samples_of(snap)
    names = {dict(labels)["process"] for (n, labels) in s if n == "gpu_process_memory_used_bytes"}
    assert names == {"\u00e9" * 7 + "\ufffd"}
    assert exit_status(findings(snap)) == 0  # --once: OK, not CRITICAL for a lost GPU
    collector = SnapshotCollector(RenderOptions())
    collector.snapshot = snap
    registry = CollectorRegistry()
    registry.register(collector)
    body = render_text(registry).decode("utf-8")
    assert 'process="\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\ufffd"' in body


def test_a_user_name_that_is_not_utf8_does_not_break_metrics(
    monkeypatch: pytest.MonkeyPatch, scenario: Scenario, nvml: Any, live_process: Any
) -> None:
    """pwd hands a Latin-1 passwd entry ("café") over with a surrogate escape; every scrape used to fail."""
    real = pwd.getpwuid

    def latin1(uid: int) -> Any:
        entry = real(uid)
        return type("E", (), {"pw_name": "caf\udce9", "pw_uid": entry.pw_uid})()

    monkeypatch.setattr(pwd, "getpwuid", latin1)  # the module procfs calls
    procfs.user_name.cache_clear()
    try:
        g = (
            scenario.add_gpu()
            .identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
            .utilization(50, 10)
            .memory(80 * GIB, 10 * GIB)
        )
        g.add_process(live_process.pid, GIB)
        scenario.write()
        poller, _ = make_poller()
        snap = poller.poll()
        poller.close()
    finally:
        procfs.user_name.cache_clear()
    collector = SnapshotCollector(RenderOptions())
    collector.snapshot = snap
    registry = CollectorRegistry()
    registry.register(collector)
    body = render_text(registry).decode("utf-8")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    users = {s.labels["user"] for s in families["gpu_process_memory_used_bytes"].samples}
    assert users == {"caf\ufffd"}
    assert '"user": "caf\\ufffd"' in as_json(snap, [])


class _Labelled(Collector):
    def __init__(self, **labels: str) -> None:
        self.labels = labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = GaugeMetricFamily("gpu_test", "Test.", labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), 1)
        yield fam


def test_exposition_survives_a_value_that_was_not_decoded_where_it_was_read() -> None:
    """The last line of defence: a lone surrogate anywhere still renders, as U+FFFD or '?'."""
    for value, shown in (("bad\udce9", "bad\ufffd"), ("lone\ud800", "lone?")):
        registry = CollectorRegistry()
        registry.register(_Labelled(pod=value))
        assert f'pod="{shown}"' in render_text(registry).decode("utf-8")


def test_label_values_are_bounded_and_stay_distinct() -> None:
    """A 100 KB pod name made /metrics 4.6 MB; two long names sharing a prefix stay two series."""
    long_a, long_b = "p" * 100_000 + "a", "p" * 100_000 + "b"
    registry = CollectorRegistry()
    registry.register(_Labelled(pod=long_a))
    registry.register(type("B", (_Labelled,), {})(pod=long_b))
    body = render_text(registry).decode()
    values = [s.labels["pod"] for f in text_string_to_metric_families(body) for s in f.samples]
    assert len(values) == 2 and len(set(values)) == 2
    assert all(len(v) == untrusted.LABEL_MAX for v in values)
    assert len(body) < 2 * untrusted.LABEL_MAX + 200
    assert untrusted.label("n" * untrusted.LABEL_MAX) == "n" * untrusted.LABEL_MAX  # at the bound: as-is


def test_a_cgroup_path_that_is_not_utf8_does_not_stop_attribution(tmp_path: Path) -> None:
    """Before: read_proc raised UnicodeDecodeError and attribution failed for every GPU of the node."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(
        b"0::/kubepods/burstable/pod0a1b2c3d-0000-1111-2222-333344445555/caf\xe9\n"
    )
    (tmp_path / "42" / "environ").write_bytes(b"PATH=/bin\0HOSTNAME=trainer-\xff\0")
    info = read_proc(42, proc_root=str(tmp_path))
    assert info.visible and info.in_pod
    assert info.pod_uid == "0a1b2c3d-0000-1111-2222-333344445555"
    assert info.hostname == "trainer-\ufffd"


def test_once_prints_names_without_driving_the_terminal(scenario: Scenario, nvml: Any) -> None:
    """An ESC sequence in a process name set the window title, cleared the screen and hid the Findings."""
    proc = named_process(b"x\x1b[2J\x1b]0;t\x07\nA")
    try:
        g = (
            scenario.add_gpu()
            .identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
            .utilization(50, 10)
            .memory(80 * GIB, 10 * GIB)
            .temperature(60)
        )
        g.add_process(proc.pid, GIB)
        g.add_process(999_999_123, GIB, name="/bin/evil\x1b[8m")  # NVML's name for a pid /proc does not show
        g.add_process(999_999_124, GIB, name="/bin/\u202egpj.exe")  # a right-to-left override: shown as "exe.jpg"
        scenario.write()
        deadline = time.monotonic() + NEVER_S
        while b"\x1b" not in Path(f"/proc/{proc.pid}/comm").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        poller, _ = make_poller()
        snap = poller.poll()
        poller.close()
    finally:
        proc.kill()
        proc.wait()
    table = as_table(snap, findings(snap))
    assert "\x1b" not in table and "\x07" not in table
    assert "x\\x1b[2J\\x1b]0;t\\x07\\nA" in table and "evil\\x1b[8m" in table
    assert "\u202e" not in table and "\\u202egpj.exe" in table
    assert table.splitlines()[-1].startswith("Findings")  # no injected line after the findings


def test_every_format_character_is_escaped_for_a_terminal() -> None:
    """Issue 38: bidi controls (U+202E reverses what follows) and zero-width characters are Unicode's
    format characters (Cf); each is written as an escape, as a control character is, and nothing else
    printable is touched."""
    import sys
    import unicodedata

    cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert "\u202e" in cf and "\u200b" in cf and "\u2066" in cf and "\ufeff" in cf
    assert [c for c in cf if untrusted.for_terminal(c) == c] == []
    assert untrusted.for_terminal("a\u202eb\U000e0041") == "a\\u202eb\\U000e0041"
    assert untrusted.for_terminal("日本語 café ß ✓ 🚀") == "日本語 café ß ✓ 🚀"


def test_terminal_and_markdown_escapes() -> None:
    assert untrusted.for_terminal("a\rb\tc\x9bd\u2028") == "a\\rb\\tc\\x9bd\\u2028"
    cell = untrusted.for_markdown("a|b\r\n<script>x</script> *b* `c` [l](u) &amp;")
    assert cell == "a\\|b \\<script\\>x\\</script\\> \\*b\\* \\`c\\` \\[l\\](u) \\&amp;"


def test_an_nvml_string_that_is_not_utf8_is_read_leniently(scenario: Scenario, nvml: Any) -> None:
    """nvidia-ml-py decodes the driver's strings strictly; a bad byte in one must not lose the GPU."""
    g = scenario.add_gpu().identity("NVIDIA H100 NAMEBYTES", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(50, 10).memory(80 * GIB, 10 * GIB)
    path = scenario.write()
    path.write_bytes(path.read_bytes().replace(b"NAMEBYTES", b"caf\xe9"))
    poller, _ = make_poller()
    snap = poller.poll()
    poller.close()
    (gpu,) = snap.gpus
    assert gpu.up and gpu.static is not None, gpu.error
    assert gpu.static.name == "NVIDIA H100 caf\ufffd"
