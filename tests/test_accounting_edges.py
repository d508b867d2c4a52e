"""The books at their edges: the first scrape, the activity setting, many users at once, a gap of
exactly ``max_step``, a GPU lost while its memory peak is still in the window, a peak exactly one
window old.  Each is something a user of the cost series would see wrong."""

from __future__ import annotations

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.peaks import WindowMax
from gpu_exporter.accounting.states import ALLOCATED_IDLE, BUSY, DOWN, IDLE, holders
from gpu_exporter.serving.accounting_metrics import accounting_families
from gpu_exporter.snapshot import Activity, GpuReading, PodRef, user_holder
from tests.test_accounting import GIB, T0, THRESHOLD, account, gpu, nonzero, prices, proc, seconds, snap


def test_a_scrape_before_the_first_poll_has_no_books_and_does_not_fail() -> None:
    acc = Accountant(threshold=THRESHOLD, prices=prices(default=1.0))
    assert [s for fam in accounting_families(acc.view()) for s in fam.samples] == []


def test_the_books_judge_idle_by_the_configured_activity_signal() -> None:
    """A GPU whose GPU-Util says busy but whose SMs are nearly idle is busy to ``gpu_utilization`` and
    allocated but idle to ``auto`` (SM activity where there is GPM), as GpuUnderutilized judges it."""
    g = gpu(utilization_ratio=0.9, activity=Activity(sm=0.01))
    for signal, state in (("gpu_utilization", BUSY), ("auto", ALLOCATED_IDLE)):
        acc = Accountant(threshold=THRESHOLD, signal=signal)
        acc.observe(snap(T0, g))
        acc.observe(snap(T0 + 10, g))
        assert account(acc.view()).state == state
        assert nonzero(acc.view()) == {("alice", state): 10}


def test_an_unheld_gpu_under_pod_attribution_counts_its_time_once_as_nobodys() -> None:
    acc = Accountant(threshold=THRESHOLD, pod_mode=True)
    free = gpu(pods=(), processes=(), utilization_ratio=0.0)
    acc.observe(snap(T0, free))
    acc.observe(snap(T0 + 10, free))
    assert account(acc.view()).state == IDLE
    assert nonzero(acc.view()) == {("", IDLE): 10}


def test_a_process_without_a_utilization_reading_adds_nothing_to_its_users_share() -> None:
    """alice's second process has no per-process utilization; her share is that of the one that has."""
    g = gpu(processes=(proc(1, sm=None, user="alice"), proc(2, sm=0.2, user="alice"), proc(3, sm=0.2, user="bob")))
    assert dict(holders(g, pod_mode=False)) == {user_holder("alice"): 0.5, user_holder("bob"): 0.5}


def test_more_users_at_once_than_the_bound_are_folded_into_other_and_the_time_still_adds_up() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=3, holder_retention=3600)
    crowd = gpu(processes=tuple(proc(i, sm=0.1, user=f"u{i}") for i in range(6)))  # six users in one poll
    acc.observe(snap(T0, crowd))
    acc.observe(snap(T0 + 60, crowd))
    busy = {user: v for (user, state), v in nonzero(acc.view()).items() if state == BUSY}
    assert set(busy) == {"u0", "u1", "u2", "other"}
    assert busy["other"] == 30 and sum(busy.values()) == 60
    # They all leave; the GPU, now free, is idle and nobody's: not "other"'s, though the bound is reached.
    acc.observe(snap(T0 + 70, gpu(processes=(), utilization_ratio=0.0)))
    assert nonzero(acc.view())[("", IDLE)] == 10
    assert ("other", IDLE) not in seconds(acc.view())


def test_a_gap_of_exactly_max_step_is_still_counted() -> None:
    """Only a gap *longer* than max_step (a stopped daemon, a suspended machine) goes uncounted."""
    acc = Accountant(threshold=THRESHOLD, max_step=60)
    acc.observe(snap(T0, gpu()))
    acc.observe(snap(T0 + 60, gpu()))
    assert nonzero(acc.view()) == {("alice", BUSY): 60}


def test_a_gpu_lost_while_its_peak_is_in_the_window_shows_no_peak() -> None:
    acc = Accountant(threshold=THRESHOLD, memory_peak_window=300)
    acc.observe(snap(T0, gpu(memory_used_bytes=30 * GIB)))
    acc.observe(snap(T0 + 5, GpuReading(index=0, uuid="GPU-0", up=False, error="lost")))
    assert account(acc.view()).memory_peak_bytes is None


def test_the_peak_window_is_open_at_its_old_end_like_max_over_time() -> None:
    """Prometheus's max_over_time(x[10s]) at t covers (t - 10 s, t]: a sample exactly 10 s old is out."""
    w = WindowMax(10)
    w.add(0.0, 50.0)
    w.add(5.0, 20.0)
    assert w.max(9.0) == 50.0
    assert w.max(10.0) == 20.0
    assert w.max(100.0) is None  # every sample has left the window


def test_a_gpu_that_stops_answering_is_nobodys_though_the_kubelet_still_assigns_it() -> None:
    """The kubelet keeps a dead GPU assigned to its pod; the books show it down and held by nobody,
    so its per-GPU series do not carry the pod's labels while it is lost."""
    a = PodRef("ml", "train-a", "main")
    acc = Accountant(threshold=THRESHOLD, pod_mode=True)
    acc.observe(snap(T0, gpu(pods=(a,))))
    assert account(acc.view()).pods == (a,)
    acc.observe(snap(T0 + 10, GpuReading(index=0, uuid="GPU-0", up=False, error="lost", pods=(a,))))
    assert account(acc.view()).pods == ()
    assert nonzero(acc.view()) == {("", DOWN): 10}


def test_idle_time_between_jobs_does_not_take_up_a_users_place() -> None:
    """With room for two users, a second user after a spell with nobody on the GPU still gets their own series."""
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0, gpu(processes=(proc(user="u1"),))))
    acc.observe(snap(T0 + 10, gpu(processes=(), utilization_ratio=0.0)))  # between jobs: nobody's
    acc.observe(snap(T0 + 20, gpu(processes=(proc(user="u2"),))))
    acc.observe(snap(T0 + 30, gpu(processes=(proc(user="u2"),))))
    assert {h for h, _ in seconds(acc.view())} - {""} == {"u1", "u2"}
