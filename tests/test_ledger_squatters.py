"""Short-lived holders cannot squat a GPU's places in the books: a place goes by GPU time, not by
arrival, so a real job coming after twenty half-second jobs gets its own series with its own
seconds; the series stay bounded and a counter never goes back while its series lives.

Time is the snapshots' steady clock (``monotonic_at``); nothing sleeps."""

from __future__ import annotations

import pytest

from gpu_exporter.accounting.ledger import Accountant, AccountingView
from gpu_exporter.snapshot import NOBODY, GpuReading, Holder, NodeSnapshot, ProcessReading, user_holder
from tests.test_accounting import GIB, H100, THRESHOLD, gpu

T0 = 1000.0  # steady seconds; the wall clock below is elsewhere on purpose
WALL = 1_800_000_000.0


def snap(t: float, *users: str) -> NodeSnapshot:
    procs = tuple(ProcessReading(100 + i, "python3", 10 * GIB, user=u) for i, u in enumerate(users))
    g: GpuReading = gpu(H100, processes=procs, utilization_ratio=0.9 if procs else 0.0)
    return NodeSnapshot(taken_at=WALL + t, duration_seconds=0.05, nvml_up=True, gpus=(g,), monotonic_at=t)


def by_holder(view: AccountingView) -> dict[Holder, float]:
    """Each named holder's seconds on the GPU, all states together (nobody's left out)."""
    out: dict[Holder, float] = {}
    for h, _, v in view.gpus[0].seconds:
        if h != NOBODY:
            out[h] = out.get(h, 0.0) + v
    return out


def other() -> Holder:
    return Holder("user", ("other",))


def squat(acc: Accountant, n: int, start: float) -> float:
    """n users, one after another, each holding the GPU for half a second; returns the time after."""
    t = start
    for i in range(n):
        acc.observe(snap(t))
        acc.observe(snap(t + 0.5, f"squatter{i}"))
        t += 1.0
    acc.observe(snap(t))
    return t


def test_a_long_job_after_twenty_short_ones_gets_its_own_seconds() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=20, holder_retention=3600)
    t = squat(acc, 20, T0)
    assert by_holder(acc.view())[user_holder("squatter19")] == 0.5  # every place taken, by arrival
    for step in range(1, 51):  # a 50-minute job, polled every minute (the squatters stay within retention)
        acc.observe(snap(t + 60 * step, "alice"))
    held = by_holder(acc.view())
    assert held[user_holder("alice")] == 3000.0
    assert other() not in held
    assert len(held) == 20  # still bounded: alice took the place of one squatter
    assert user_holder("squatter0") not in held  # the least time, and the oldest among equals
    assert held[user_holder("squatter1")] == 0.5  # the others keep theirs


def test_a_holder_holding_now_keeps_its_place_though_it_has_the_least_time() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0))
    acc.observe(snap(T0 + 1, "a"))  # a: 1 s
    acc.observe(snap(T0 + 21, "b"))  # b: 20 s
    acc.observe(snap(T0 + 22, "a"))  # a: 2 s, and holding
    acc.observe(snap(T0 + 24, "a", "c"))  # full: b, not holding now, gives up its place
    assert by_holder(acc.view()) == {user_holder("a"): 3.0, user_holder("c"): 1.0}


def test_a_newcomer_takes_the_place_of_the_holder_with_the_least_time() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0))
    acc.observe(snap(T0 + 10, "a"))  # a: 10 s
    acc.observe(snap(T0 + 13, "b"))  # b: 3 s
    acc.observe(snap(T0 + 20, "c"))  # full; b has less than a: b's place
    held = by_holder(acc.view())
    assert held == {user_holder("a"): 10.0, user_holder("c"): 7.0}
    acc.observe(snap(T0 + 30, "b"))  # b again: c (7 s) has less than a (10 s); b starts afresh
    held = by_holder(acc.view())
    assert (held.get(user_holder("b")), user_holder("c") in held, held[user_holder("a")]) == (10.0, False, 10.0)


def test_among_equal_times_the_oldest_hold_gives_up_its_place() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0))
    acc.observe(snap(T0 + 5, "a"))
    acc.observe(snap(T0 + 10, "b"))  # both 5 s; a held it first
    acc.observe(snap(T0 + 11, "c"))
    held = by_holder(acc.view())
    assert (user_holder("a") in held, user_holder("b") in held, held.get(user_holder("c"))) == (False, True, 1.0)


def test_with_every_place_held_now_a_newcomer_is_other_and_counters_only_grow() -> None:
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0, "a", "b"))
    seen: dict[Holder, float] = {}
    for i in range(1, 6):
        acc.observe(snap(T0 + 10 * i, "a", "b", f"short{i}"))  # a and b hold throughout
        for h, v in by_holder(acc.view()).items():
            assert v >= seen.get(h, 0.0), h  # no counter goes back while its series lives
            seen[h] = v
    held = by_holder(acc.view())
    assert [held[h] for h in (user_holder("a"), user_holder("b"), other())] == pytest.approx([50 / 3] * 3)
    assert not any(h.values[0].startswith("short") for h in held)


def test_a_place_goes_to_the_least_time_in_all_its_states_together() -> None:
    """B's 2.5 s are spread over two states (1 s busy, 1.5 s held idle), A's 2 s are in one: A has the
    least time, whatever states each was booked in, so A gives up its place to C."""
    acc = Accountant(threshold=THRESHOLD, max_users=2, holder_retention=3600)
    acc.observe(snap(T0))
    acc.observe(snap(T0 + 2, "alice"))
    acc.observe(snap(T0 + 3))
    acc.observe(snap(T0 + 4, "bob"))
    idle = ProcessReading(101, "python3", 10 * GIB, user="bob")
    held_idle = gpu(H100, processes=(idle,), utilization_ratio=0.0)
    acc.observe(NodeSnapshot(taken_at=WALL + 5.5, duration_seconds=0.05, nvml_up=True, gpus=(held_idle,),
                             monotonic_at=T0 + 5.5))  # fmt: skip
    acc.observe(snap(T0 + 6))
    states = {(h, s) for h, s, v in acc.view().gpus[0].seconds if h == user_holder("bob") and v > 0}
    assert {s for _, s in states} == {"busy", "allocated_idle"}
    acc.observe(snap(T0 + 7, "carol"))
    held = by_holder(acc.view())
    assert user_holder("alice") not in held and held[user_holder("bob")] == 2.5 and user_holder("carol") in held
