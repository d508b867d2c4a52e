"""The daemon's books (gpu_exporter.accounting) on scripted snapshots: each poll's time goes to
exactly one state, split between holders, with prices only where configured.

Time is the snapshots' own ``taken_at``; nothing sleeps.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.accounting.ledger import Accountant, AccountingView, GpuAccount
from gpu_exporter.accounting.peaks import WindowMax
from gpu_exporter.accounting.pricing import PriceBook
from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.accounting.states import (
    ALLOCATED_IDLE,
    ALLOCATED_UNKNOWN,
    BUSY,
    DOWN,
    IDLE,
    NOBODY,
    classify,
    holders,
)
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.settings.config import ConfigError, load_settings
from gpu_exporter.snapshot import (
    Activity,
    GpuReading,
    GpuStatic,
    Holder,
    MigReading,
    NodeSnapshot,
    PodRef,
    ProcessReading,
)
from gpu_exporter.sources.procfs import process_user, user_name

GIB = 1024**3
T0 = 1_800_000_000.0
THRESHOLD = RulesSettings().GpuUnderutilized.threshold
H100 = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")
L4 = GpuStatic(index=1, uuid="GPU-1", name="NVIDIA L4", pci_bus_id="00000000:3A:00.0")


def proc(pid: int = 100, used: int = 10 * GIB, sm: float | None = None, user: str | None = "alice",
         pod: PodRef | None = None) -> ProcessReading:  # fmt: skip
    return ProcessReading(pid, "python3", used, sm_utilization_ratio=sm, user=user, pod=pod)


def gpu(static: GpuStatic = H100, **kw: Any) -> GpuReading:
    base: dict[str, Any] = dict(index=static.index, uuid=static.uuid, up=True, static=static,
                                utilization_ratio=0.9, memory_total_bytes=80 * GIB, memory_used_bytes=10 * GIB,
                                processes=(proc(),))  # fmt: skip
    base.update(kw)
    return GpuReading(**base)


def snap(t: float, *gpus: GpuReading, nvml_up: bool = True) -> NodeSnapshot:
    return NodeSnapshot(taken_at=t, duration_seconds=0.05, nvml_up=nvml_up, gpus=gpus)


def seconds(view: AccountingView, index: int = 0) -> dict[tuple[str, str], float]:
    """(holder name, state) -> seconds of one GPU; the holder is its pod (ns/pod/container), its job
    (job:<id>), its container (container:<name>) or its user."""
    a = next(a for a in view.gpus if a.index == index)
    out: dict[tuple[str, str], float] = {}
    for h, state, value in a.seconds:
        ns, pod, container, user = h.get("namespace"), h.get("pod"), h.get("container"), h.get("user")
        name = f"{ns}/{pod}/{container}" if pod else user
        if h.kind == "job":
            name = f"job:{h.get('hpc_job')}"
        elif h.kind == "container":
            name = f"container:{h.get('container_name')}"
        out[(name, state)] = out.get((name, state), 0.0) + value
    return out


def nonzero(view: AccountingView, index: int = 0) -> dict[tuple[str, str], float]:
    return {k: round(v, 6) for k, v in seconds(view, index).items() if v}


def account(view: AccountingView, index: int = 0) -> GpuAccount:
    return next(a for a in view.gpus if a.index == index)


# -- states ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reading", "state"),
    [
        (gpu(utilization_ratio=0.9), BUSY),
        (gpu(utilization_ratio=THRESHOLD), BUSY),  # at the threshold is busy, as the rule's "below" says
        (gpu(utilization_ratio=0.05), ALLOCATED_IDLE),
        (gpu(utilization_ratio=0.05, processes=(proc(used=0),)), IDLE),  # a process without memory holds nothing
        (gpu(utilization_ratio=0.05, processes=()), IDLE),
        (gpu(utilization_ratio=0.0, processes=(), pods=(PodRef("ml", "a", "main"),)), ALLOCATED_IDLE),
        (gpu(utilization_ratio=1.0, activity=Activity(sm=0.03)), ALLOCATED_IDLE),  # GPM says what GPU-Util hides
        (gpu(utilization_ratio=0.0, activity=Activity(sm=0.5)), BUSY),
        (gpu(utilization_ratio=None), ALLOCATED_UNKNOWN),  # no signal at all: held, neither busy nor idle
        (gpu(utilization_ratio=None, processes=()), IDLE),
        (GpuReading(index=0, uuid="GPU-0", up=False, error="lost"), DOWN),
    ],
)
def test_each_reading_is_in_one_state(reading: GpuReading, state: str) -> None:
    assert classify(reading, THRESHOLD) == state


def test_the_signal_setting_is_the_underutilized_rules() -> None:
    g = gpu(utilization_ratio=1.0, activity=Activity(sm=0.03))
    assert classify(g, THRESHOLD, "auto") == ALLOCATED_IDLE
    assert classify(g, THRESHOLD, "gpu_utilization") == BUSY
    # No SM activity: no signal, so neither busy nor idle.
    assert classify(gpu(utilization_ratio=1.0), THRESHOLD, "sm_active") == ALLOCATED_UNKNOWN
    assert classify(g, 0.02, "auto") == BUSY  # the threshold is a setting


def test_processes_on_mig_devices_hold_their_gpu() -> None:
    mig = MigReading(0, "MIG-a", "1g.10gb", 1, 0, processes=(proc(),))
    g = gpu(utilization_ratio=None, processes=(), activity=Activity(sm=0.0), migs=(mig,))
    assert classify(g, THRESHOLD) == ALLOCATED_IDLE


# -- the books ---------------------------------------------------------------------------------------------
def test_each_poll_adds_the_time_since_the_previous_to_one_state() -> None:
    acc = Accountant(threshold=THRESHOLD)
    trace = [(0, 0.9), (5, 0.9), (10, 0.02), (15, 0.02), (17.5, 0.95)]
    for t, util in trace:
        acc.observe(snap(T0 + t, gpu(utilization_ratio=util)))
    # The first poll adds nothing; each later one adds its step to the state it sees.
    assert nonzero(acc.view()) == {("alice", BUSY): 5 + 2.5, ("alice", ALLOCATED_IDLE): 5 + 5}
    assert sum(seconds(acc.view()).values()) == pytest.approx(17.5)


def test_unheld_idle_and_down_exist_from_the_first_poll_the_others_from_first_use() -> None:
    acc = Accountant(threshold=THRESHOLD)
    acc.observe(snap(T0, gpu(processes=(), utilization_ratio=0.0)))
    assert seconds(acc.view()) == {("", IDLE): 0.0, ("", DOWN): 0.0}
    acc.observe(snap(T0 + 5, gpu(processes=(), utilization_ratio=0.5)))  # busy with no holder: a new series
    assert seconds(acc.view()) == {("", IDLE): 0.0, ("", DOWN): 0.0, ("", BUSY): 5.0}


def test_a_lost_gpu_and_a_down_nvml_count_as_down() -> None:
    acc = Accountant(threshold=THRESHOLD)
    acc.observe(snap(T0, gpu(), gpu(L4, processes=())))
    acc.observe(snap(T0 + 5, gpu(), GpuReading(index=1, uuid="GPU-1", up=False, error="lost")))
    acc.observe(snap(T0 + 15, nvml_up=False))  # the driver went away: nothing can use any GPU
    acc.observe(snap(T0 + 20, gpu(), gpu(L4, processes=(), utilization_ratio=0.0)))
    assert nonzero(acc.view(), 0) == {("alice", BUSY): 10, ("", DOWN): 10}
    assert nonzero(acc.view(), 1) == {("", DOWN): 15, ("", IDLE): 5}
    acc.observe(snap(T0 + 25, gpu()))  # GPU 1 vanished from the count
    assert nonzero(acc.view(), 1)[("", DOWN)] == 20
    assert account(acc.view(), 1).state == DOWN


def test_a_gap_beyond_max_step_and_a_clock_stepping_back_add_nothing() -> None:
    acc = Accountant(threshold=THRESHOLD, max_step=60)
    for t in (0, 5, 605, 610, 600, 615):  # stopped for 10 min; then the clock steps back 10 s
        acc.observe(snap(T0 + t, gpu()))
    assert nonzero(acc.view()) == {("alice", BUSY): 5 + 5 + 5}


def test_a_time_sliced_gpu_is_split_by_per_process_utilization() -> None:
    a, b = PodRef("ml", "train-a", "main"), PodRef("ml", "serve-b", "main")
    pods = (a, b)
    acc = Accountant(threshold=THRESHOLD, pod_mode=True)
    busy = gpu(pods=pods, processes=(proc(1, sm=0.6, pod=a), proc(2, sm=0.2, pod=b)))
    acc.observe(snap(T0, busy))
    acc.observe(snap(T0 + 8, busy))
    assert nonzero(acc.view()) == {("ml/train-a/main", BUSY): 6, ("ml/serve-b/main", BUSY): 2}


@pytest.mark.parametrize(
    "processes",
    [
        (proc(1, sm=None, pod=PodRef("ml", "a", "main")), proc(2, sm=None, pod=PodRef("ml", "b", "main"))),
        (proc(1, sm=0.0, pod=PodRef("ml", "a", "main")), proc(2, sm=0.0, pod=PodRef("ml", "b", "main"))),
        (proc(1, sm=0.5, pod=PodRef("ml", "a", "main")),),  # b's share is unknown (no visible process)
    ],
    ids=["utilization unknown", "both idle", "one holder without processes"],
)
def test_a_shared_gpu_is_split_evenly_where_utilization_does_not_say(processes: tuple[ProcessReading, ...]) -> None:
    pods = (PodRef("ml", "a", "main"), PodRef("ml", "b", "main"))
    acc = Accountant(threshold=THRESHOLD, pod_mode=True)
    for t in (0, 10):
        acc.observe(snap(T0 + t, gpu(pods=pods, processes=processes)))
    assert nonzero(acc.view()) == {("ml/a/main", BUSY): 5, ("ml/b/main", BUSY): 5}


def test_containers_of_one_pod_split_its_share() -> None:
    pods = (PodRef("ml", "a", "main"), PodRef("ml", "a", "sidecar"), PodRef("ml", "b", "main"))
    shares = dict(holders(gpu(pods=pods, processes=()), pod_mode=True))
    assert shares == {Holder("pod", ("ml", "a", "main")): 0.25, Holder("pod", ("ml", "a", "sidecar")): 0.25,
                      Holder("pod", ("ml", "b", "main")): 0.5}  # fmt: skip


def test_without_pods_the_holders_are_users_split_by_their_processes() -> None:
    acc = Accountant(threshold=THRESHOLD)
    g = gpu(processes=(proc(1, sm=0.3, user="alice"), proc(2, sm=0.1, user="alice"), proc(3, sm=0.4, user="bob"),
                       proc(4, used=0, sm=0.9, user="eve"), proc(5, sm=0.0, user=None)))  # fmt: skip
    acc.observe(snap(T0, g))
    acc.observe(snap(T0 + 8, g))
    assert nonzero(acc.view()) == {("alice", BUSY): 4, ("bob", BUSY): 4}  # eve holds no memory; unknown at 0%


def test_users_beyond_the_bound_count_as_other_and_gone_holders_leave() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=60)
    for i, user in enumerate(("u1", "u2", "u3", "u4")):  # u1 and u2 hold throughout: u3 and u4 find no place
        acc.observe(snap(T0 + 10 * i, gpu(processes=(proc(1, user="u1"), proc(2, user="u2"), proc(3, user=user)))))
    users = {h for h, _ in seconds(acc.view())} - {""}
    assert users == {"u1", "u2", "other"}
    acc.observe(snap(T0 + 100, gpu(processes=(proc(user="u5"),))))  # the others gone for over a minute
    assert {h for h, _ in seconds(acc.view())} - {""} == {"u5"}


def test_pod_holders_leave_after_the_retention_and_a_return_starts_afresh() -> None:
    a = PodRef("ml", "a", "main")
    acc = Accountant(threshold=THRESHOLD, pod_mode=True, holder_retention=30)
    acc.observe(snap(T0, gpu(pods=(a,))))
    acc.observe(snap(T0 + 10, gpu(pods=(a,))))
    acc.observe(snap(T0 + 20, gpu(pods=(), processes=())))
    assert ("ml/a/main", BUSY) in seconds(acc.view())
    acc.observe(snap(T0 + 50, gpu(pods=(), processes=())))
    assert ("ml/a/main", BUSY) not in seconds(acc.view())


def test_last_active_is_the_last_busy_poll_and_absent_before() -> None:
    acc = Accountant(threshold=THRESHOLD)
    acc.observe(snap(T0, gpu(utilization_ratio=0.0)))
    assert account(acc.view()).last_active is None
    acc.observe(snap(T0 + 5, gpu(utilization_ratio=0.5)))
    acc.observe(snap(T0 + 10, gpu(utilization_ratio=0.0)))
    assert account(acc.view()).last_active == T0 + 5


def test_the_memory_peak_is_the_highest_poll_over_the_window() -> None:
    acc = Accountant(threshold=THRESHOLD, memory_peak_window=60)
    for t, used in ((0, 10), (5, 30), (10, 20), (50, 15)):
        acc.observe(snap(T0 + t, gpu(memory_used_bytes=used * GIB)))
    assert account(acc.view()).memory_peak_bytes == 30 * GIB  # a peak a 30 s scrape could miss
    acc.observe(snap(T0 + 66, gpu(memory_used_bytes=5 * GIB)))
    assert account(acc.view()).memory_peak_bytes == 20 * GIB
    acc.observe(snap(T0 + 200, GpuReading(index=0, uuid="GPU-0", up=False, error="lost")))
    assert account(acc.view()).memory_peak_bytes is None  # a lost GPU has no memory reading


def test_window_max_against_a_brute_force() -> None:
    import random

    rng = random.Random(7)
    w = WindowMax(10)
    samples: list[tuple[float, float]] = []
    t = 0.0
    for _ in range(500):
        t += rng.uniform(0.1, 3)
        v = rng.uniform(0, 100)
        w.add(t, v)
        samples.append((t, v))
        assert w.max(t) == max(x for s, x in samples if s > t - 10)


# -- prices ------------------------------------------------------------------------------------------------
def prices(**kw: Any) -> PriceBook:
    return PriceBook(PricingSettings(**{"currency": "usd", **kw}))


def test_the_longest_matching_model_key_wins_then_the_default() -> None:
    book = prices(models={"H100": 2.5, "H100 NVL": 3.0, "l4": 0.8}, default=1.0)
    assert book.currency == "USD"
    assert book.per_hour("NVIDIA H100 80GB HBM3") == 2.5
    assert book.per_hour("NVIDIA H100 NVL") == 3.0
    assert book.per_hour("NVIDIA L4") == 0.8  # case-insensitive
    assert book.per_hour("Tesla T4") == 1.0
    assert prices(models={"H100": 2.5}).per_hour("Tesla T4") is None


def test_a_model_key_prices_the_gpus_whose_name_holds_it_as_a_word() -> None:
    """The daemon matched a key anywhere in the name: with keys for the cards of 2026 only, it priced
    a GH200 at the H200's price, an L40S at the L40's, an A10G at the A10's, a GB200 at the B200's,
    while the report (which matches words) priced none of them, so the two disagreed on the money."""
    book = prices(models={"H200": 4.0, "L40": 1.2, "A10": 0.9, "B200": 8.0, "L4": 0.8})
    for gpu_name in ("NVIDIA GH200 480GB", "NVIDIA L40S", "NVIDIA A10G", "NVIDIA GB200", "NVIDIA A100-SXM4-80GB"):
        assert book.per_hour(gpu_name) is None, gpu_name
    assert [book.per_hour(n) for n in ("NVIDIA H200", "NVIDIA L40", "NVIDIA A10", "NVIDIA B200", "NVIDIA L4")] == [
        4.0, 1.2, 0.9, 8.0, 0.8]  # fmt: skip
    # A word ends at anything that is not a letter or digit, as NVML's names separate their parts.
    assert prices(models={"A100": 2.0}).per_hour("NVIDIA A100-SXM4-80GB") == 2.0
    assert prices(models={"a100 80gb": 2.2}).per_hour("NVIDIA A100 80GB PCIe") == 2.2


def test_the_daemon_and_the_report_price_a_card_alike() -> None:
    from gpu_exporter.report.catalogue import load_catalogue
    from gpu_exporter.report.prices import PriceList

    settings = PricingSettings(currency="usd", models={"H200": 4.0, "L4": 0.8, "H100 NVL": 3.1, "H100": 2.5})
    book, report = PriceBook(settings), PriceList(load_catalogue(None), "USD", {}, settings)
    for card in ("H200", "GH200", "L4", "L40S", "H100 NVL", "H100 80GB", "H100 PCIe"):
        quoted = report.card(card)
        assert book.per_hour(f"NVIDIA {card}") == (quoted.per_hour if quoted else None), card


def test_no_price_means_no_cost_series() -> None:
    acc = Accountant(threshold=THRESHOLD, prices=prices(models={"H100": 2.5}))
    acc.observe(snap(T0, gpu(), gpu(L4)))
    assert account(acc.view(), 0).price_per_hour == 2.5
    assert account(acc.view(), 1).price_per_hour is None
    assert account(acc.view(), 0).energy_price_per_kwh is None
    unpriced = Accountant(threshold=THRESHOLD)
    unpriced.observe(snap(T0, gpu()))
    assert unpriced.view().currency is None and account(unpriced.view()).price_per_hour is None


@pytest.mark.parametrize(
    ("pricing", "needle"),
    [
        ({"models": {"H100": 2.5}}, "pricing.currency"),
        ({"currency": "USD"}, "at least one of models, default or energy_per_kwh"),
        ({"currency": "USD", "models": {"H100": -1}}, "greater than or equal to 0"),
        ({"currency": "USD", "models": {"  ": 1}}, "must name part of a GPU name"),
        ({"currency": "USD", "models": {"L4": 1, "l4": 2}}, "given twice"),
        ({"currency": "US Dollar", "default": 1}, "pricing.currency"),
        ({"currency": "USD", "default": 1, "energy": 0.1}, "unknown setting 'pricing.energy'"),
    ],
)
def test_bad_pricing_is_refused_naming_the_problem(tmp_path: Path, pricing: dict[str, Any], needle: str) -> None:
    import yaml

    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"pricing": pricing}))
    with pytest.raises(ConfigError, match=needle):
        load_settings(config_file=cfg)


def test_the_shipped_example_pricing_file_is_a_valid_config() -> None:
    path = Path(__file__).resolve().parent.parent / "deploy" / "pricing.example.yaml"
    text = path.read_text()
    assert "example" in text.lower()
    settings = load_settings(config_file=path)
    assert settings.pricing is not None and settings.pricing.models and settings.pricing.energy_per_kwh


# -- users from /proc ----------------------------------------------------------------------------------------
def test_a_process_user_is_its_real_uid_named_by_passwd(tmp_path: Path) -> None:
    assert process_user(os.getpid()) == pwd.getpwuid(os.getuid()).pw_name
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("Name:\tpython3\nUid:\t4242424\t0\t0\t0\nGid:\t0\t0\t0\t0\n")
    assert process_user(42, str(tmp_path)) == "4242424"  # unknown to passwd: the number
    assert process_user(43, str(tmp_path)) is None  # not visible
    assert user_name(0) == "root"
    assert NOBODY.kind == "" and NOBODY.labels() == {} and NOBODY.name == ""
