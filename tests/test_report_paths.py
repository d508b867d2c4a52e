"""Which series each part of a range is read from (gpu_exporter/report/paths.py): the recorded series
alone where the rules cover the whole range; where only its ends keep it from them (``--since 30d``),
the raw series at the ends and the recorded ones between; and the money of a range read in parts,
which must be the money of its parts, to the cent."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from gpu_exporter.report import queries
from gpu_exporter.report.charges import charges
from gpu_exporter.report.cost import Part
from gpu_exporter.report.model import build, iso
from gpu_exporter.report.paths import RECORDED, NotRecorded, Read, reads, split, together
from gpu_exporter.report.queries import HOUR, LAG, RangeError, Window, end_window
from tests import assert_mentions
from tests.test_report_model import CATALOGUE, H100, add_gpu, empty

H = 1_800_000_000 // HOUR * HOUR


class _Store:
    """Answers the coverage query: the rules ran for every hour that ended at ``until`` or before."""

    def __init__(self, until: float | None = None) -> None:
        self.until = until
        self.asked: list[tuple[str, float]] = []

    def instant(self, expr: str, at: float, what: str = "") -> list[tuple[dict[str, str], float]]:
        self.asked.append((expr, at))
        if self.until is None:
            return []
        span = int(re.search(r"\[(\d+)ms:1h\]", expr).group(1)) + 1  # type: ignore[union-attr]
        end = at - LAG
        hours = sum(1 for k in range(span // 1000 // HOUR) if end - k * HOUR <= self.until)
        return [({}, float(hours))]

    def range(self, expr: str, start: float, end: float, step: float,
              what: str = "") -> list[tuple[dict[str, str], list[tuple[float, float]]]]:  # fmt: skip
        """Which hours the recorded series hold (``queries.hour_covered``, at each hour's end + LAG)."""
        self.asked.append((expr, start))
        assert expr == queries.hour_covered() and step == HOUR
        points = [
            (float(t), 1.0) for t in range(int(start), int(end) + 1, HOUR) if self.until and t - LAG <= self.until
        ]
        return [({}, points)] if points else []


def _interval(seconds: float = 15.0) -> Any:
    asked: list[int] = []

    def interval() -> float:
        asked.append(1)
        return seconds

    interval.asked = asked  # type: ignore[attr-defined]
    return interval


def test_a_whole_range_the_rules_ran_for_is_read_recorded_alone_and_the_store_asked_once() -> None:
    store, interval = _Store(H), _interval()
    got, said = reads(store, "auto", H - 48 * HOUR, H, H + 3 * HOUR, interval)
    assert got == [Read(Window(H - 48 * HOUR, H, HOUR), True)] and said == RECORDED
    assert store.asked == [(queries.coverage(got[0].w), H + LAG)]
    assert interval.asked == []  # no raw part: the scrape interval is not asked


def test_a_whole_range_the_recorded_series_lack_an_hour_of_reads_that_hour_raw_and_says_so() -> None:
    """Issue 48: the hours the recorded series lack are read raw, the others recorded, and the line says
    how many."""
    for mode in ("auto", "yes"):
        got, said = reads(_Store(H - HOUR), mode, H - 48 * HOUR, H, H + 3 * HOUR, _interval())
        assert got == [Read(Window(H - 48 * HOUR, H - HOUR, HOUR), True),
                       Read(queries.window_for(H - HOUR, H, 15), False, filled=True)]  # fmt: skip
        assert got[1].filled and got[1].w.scrape == 15
        assert_mentions(said, "in parts", "lack 1 of its hours", "read raw")
    got, said = reads(_Store(None), "auto", H - 48 * HOUR, H, H + 3 * HOUR, _interval())
    assert not got[0].recorded and "0 of the range's 48" in said
    # A store without the rules is told, plainly, what loading them would change (it read as a riddle:
    # "a tenth of the store's time").
    assert_mentions(said, "load alerts/gpu-report.rules.yml into the store", "one sample per GPU and hour")
    assert "tenth" not in said
    store = _Store(H)
    got, said = reads(store, "no", H - 48 * HOUR, H, H + 3 * HOUR, _interval())
    assert not got[0].recorded and said == "reading the raw series" and store.asked == []


def test_since_30d_reads_its_ends_raw_and_the_hours_between_recorded() -> None:
    """--since 30d at 37 min 12 s past the hour: the raw series from its start to the next whole hour
    (22 min 48 s), the recorded hours the rules have written (717 h, to 2 h ago), the raw series since."""
    now = H + 37 * 60 + 12
    store = _Store(H - 2 * HOUR)
    got, said = reads(store, "yes", now - 720 * HOUR, now, now, _interval())
    assert [(r.w.start, r.w.end, r.recorded) for r in got] == [
        (now - 720 * HOUR, H - 719 * HOUR, False),
        (H - 719 * HOUR, H - 2 * HOUR, True),
        (H - 2 * HOUR, now, False),
    ]
    assert got[1].w.step == HOUR and got[1].w.points == 717
    for r in (got[0], got[2]):  # each raw end tiled exactly, in steps of 3 scrape intervals to an hour
        assert r.w.points * r.w.step == r.w.end - r.w.start and 45 <= r.w.step <= HOUR
    assert store.asked == [(queries.coverage(got[1].w), got[1].w.end + LAG)]
    assert_mentions(
        said,
        f"raw from {iso(now - 720 * HOUR)} to {iso(H - 719 * HOUR)}",
        f"recorded from {iso(H - 719 * HOUR)} to {iso(H - 2 * HOUR)}",
        f"raw from {iso(H - 2 * HOUR)}",
    )


def test_an_end_is_cut_into_the_finest_steps_of_three_scrapes_to_an_hour() -> None:
    assert end_window(H, H + 3600, 15).step == 45  # three scrape intervals
    assert end_window(H, H + 600, 0).step == 5  # 5 s at least
    assert end_window(H, H + 3 * HOUR, 1).step == 15  # 720 steps at most
    assert end_window(H, H + 2 * HOUR, 1200).step == HOUR  # an hour at most: three 20-minute scrapes
    assert end_window(H, H + 1381, 15).step == 1381  # a prime: one step
    with pytest.raises(RangeError, match="7300 s"):
        end_window(H, H + 7300, 1200)  # no divisor from 3,600 s to an hour but 3,600: none
    assert split(H - 30.5, H + 48 * HOUR, H + 100 * HOUR, 15) is None  # no whole second: the raw path says so


def test_an_end_no_step_can_tile_is_made_an_hour_longer() -> None:
    """A head of 30 s is shorter than a step (three scrape intervals, 45 s), and a tail of 9,421 s (a
    prime) has no step of 45 s to an hour: each takes the recorded hour next to it too."""
    for length in (30, 9421):
        with pytest.raises(RangeError, match=f"{length} s"):
            end_window(H, H + length, 15)
    now = H + 48 * HOUR + 9421  # a range ending now: its hours to 2 h ago are written
    s = split(H - 30, now, now, 15)
    assert s is not None and s.head is not None and s.tail is not None
    assert (s.head.start, s.head.end) == (H - 30, H + HOUR)
    assert (s.middle.start, s.middle.end) == (H + HOUR, H + 47 * HOUR)
    assert (s.tail.start, s.tail.end) == (H + 47 * HOUR, now)
    for w in (s.head, s.tail):
        assert w.points * w.step == w.end - w.start and 45 <= w.step <= HOUR
    # Ends that no number of hours more would let be cut (steps of three 20-minute scrapes can only be
    # whole hours): the range is read raw.
    assert split(H - 30, now, now, 1200) is None


def test_a_range_without_24_whole_hours_written_within_it_is_read_raw() -> None:
    now = H + 37 * 60
    got, said = reads(_Store(H), "auto", now - 25 * HOUR, now, now, _interval())
    assert [r.recorded for r in got] == [False]
    assert_mentions(said, "not 1 to 30 days on whole hours", "24 to 720 whole hours")
    with pytest.raises(NotRecorded, match="24 to 720"):
        reads(_Store(H), "yes", now - 25 * HOUR, now, now, _interval())
    # Written for a part of the hours within it only: those recorded, the others raw, saying how many.
    got, said = reads(_Store(H - 10 * HOUR), "auto", now - 720 * HOUR, now, now, _interval())
    assert [(r.recorded, r.filled) for r in got] == [(False, False), (True, False), (False, True), (False, False)]
    assert got[2].w.end - got[2].w.start == 8 * HOUR and "lack 8 of its hours" in said
    _, said = reads(_Store(None), "auto", now - 720 * HOUR, now, now, _interval())
    assert_mentions(said, "0 of the 717 whole hours", "alerts/gpu-report.rules.yml")
    # A range ending on a whole hour an hour ago: its last hour is not written yet, so it is read raw.
    got, said = reads(_Store(H - 2 * HOUR), "auto", H - 48 * HOUR, H - HOUR, H, _interval())
    assert [(r.w.start, r.w.end, r.recorded) for r in got] == [
        (H - 48 * HOUR, H - 2 * HOUR, True),
        (H - 2 * HOUR, H - HOUR, False),
    ]


def test_the_edges_of_the_recorded_path_are_its_own() -> None:
    """A range that ended 2 h ago exactly is written; one of exactly 24 and 720 whole hours within a
    range off them is read in parts; one that ends off the hour long before now ends its middle at the
    hour before its end; and the raw path's steps are three scrape intervals at least."""
    got, said = reads(_Store(H), "auto", H - 48 * HOUR, H, H + LAG, _interval())
    assert [r.recorded for r in got] == [True] and said == RECORDED
    # Read raw, a range is cut into steps of three scrape intervals at least (45 s, not 10 s).
    got, _ = reads(_Store(None), "auto", H - 2 * HOUR, H, H + LAG, _interval())
    assert got == [Read(Window(H - 2 * HOUR, H, 45), False)]
    for hours in (24, 720):
        s = split(H - hours * HOUR - 100, H + 100, H + 10 * HOUR, 15)
        assert s is not None and (s.middle.start, s.middle.end) == (H - hours * HOUR, H), hours
    assert split(H - 23 * HOUR - 100, H + 100, H + 10 * HOUR, 15) is None
    assert split(H - 721 * HOUR - 100, H + 100, H + 10 * HOUR, 15) is None
    s = split(H - 48 * HOUR - 100, H - 1000, H + 10 * HOUR, 15)
    assert s is not None and s.middle.end == H - HOUR and s.tail is not None and s.tail.end == H - 1000
    got, said = reads(_Store(H), "no", H - HOUR, H, H + 10 * HOUR, _interval())
    assert got == [Read(Window(H - HOUR, H, 45), False)] and said == "reading the raw series"
    # A range of 25 whole hours ending an hour ago: not written yet, and only 23 h within it are.
    got, said = reads(_Store(H), "auto", H - 25 * HOUR, H - HOUR, H, _interval())
    assert [r.recorded for r in got] == [False]
    assert_mentions(said, "1 to 2 h after it ends", iso(H - HOUR), "24 to 720 whole hours")


# -- the money of parts ----------------------------------------------------------------------------
A = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-a"}
B = {"node": "n2", "instance": "n2:9445", "gpu": "0", "uuid": "GPU-b"}
POD = {"namespace": "ml", "pod": "train"}


def _part(w: Window, busy: float, price_a: float, peak: float, activity: float) -> Part:
    """A's hours busy by the pod (the rest idle) at one price, B idle at 2.0, over ``w``."""
    r = empty()
    add_gpu(r, A, H100, {"busy": busy, "idle": w.hours - busy}, price=price_a, holder=POD, peak=peak,
            activity=activity, w=w)  # fmt: skip
    add_gpu(r, B, H100, {"idle": w.hours}, price=2.0, w=w)
    r["holders_now"] = [({**A, **POD}, 1.0)]
    r["timeline"] = [({"state": "busy"}, [(w.start + (k + 1) * w.step, busy / w.points) for k in range(w.points)])]
    return Part(w, r)


def _three(price_tail: float = 3.0) -> list[Part]:
    head = Window(H - 1380, H, 60)
    middle = Window(H, H + 48 * HOUR, HOUR)
    tail = Window(H + 48 * HOUR, H + 48 * HOUR + 9420, 60)
    return [_part(head, 0.2, 3.0, 30e9, 0.9), _part(middle, 40.0, 3.0, 10e9, 0.3),
            _part(tail, 1.0, price_tail, 20e9, 0.5)]  # fmt: skip


def _doc(parts: list[Part]) -> dict[str, Any]:
    w = Window(parts[0].w.start, parts[-1].w.end, HOUR)
    return build(w, together(parts), CATALOGUE, parts=parts)


def test_a_range_read_in_parts_costs_what_its_parts_cost() -> None:
    parts = _three()
    doc = _doc(parts)
    alone = [build(p.w, p.results, CATALOGUE) for p in parts]
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    for uuid in ("GPU-a", "GPU-b"):
        each = [next(g for g in d["gpus"] if g["uuid"] == uuid) for d in alone]
        assert gpus[uuid]["cost"] == pytest.approx(sum(g["cost"] for g in each), abs=1e-4)
        assert gpus[uuid]["gpu_hours"] == pytest.approx(sum(g["gpu_hours"] for g in each), abs=1e-6)
    hours = (1380 + 48 * HOUR + 9420) / HOUR
    assert gpus["GPU-a"]["busy_hours"] == pytest.approx(41.2) and gpus["GPU-a"]["gpu_hours"] == pytest.approx(hours)
    assert doc["totals"]["cost"] == pytest.approx(hours * 3.0 + hours * 2.0, abs=1e-4)
    (pod,) = doc["holders"]
    assert pod["busy_hours"] == pytest.approx(41.2) and pod["cost"] == pytest.approx(41.2 * 3.0, abs=1e-4)
    # The highest of the parts' figures: the head's memory peak and activity, never the middle's alone.
    assert gpus["GPU-a"]["memory_peak_bytes"] == 30e9 and gpus["GPU-a"]["activity_p95"] == 0.9
    assert doc["range"]["start"] == iso(H - 1380) and doc["range"]["hours"] == pytest.approx(hours)


def test_the_timeline_of_parts_has_a_point_per_whole_hour() -> None:
    doc = _doc(_three())
    times = [p["time"] for p in doc["timeline"]]
    # The head's steps in its hour's end, the middle's hours as they are, the tail's in whole hours
    # and its last, partial one at the range's end.
    assert times[0] == iso(H) and times[1] == iso(H + HOUR) and times[-1] == iso(H + 48 * HOUR + 9420)
    assert times[-2] == iso(H + 50 * HOUR) and len(times) == 1 + 48 + 3
    assert doc["timeline"][0]["busy_hours"] == pytest.approx(0.2)
    assert sum(p["busy_hours"] for p in doc["timeline"]) == pytest.approx(41.2)


def test_a_price_period_goes_on_across_parts_and_ends_where_the_price_changes() -> None:
    same = _doc(parts := _three())
    rows = charges(parts, same)
    a_busy = [c for c in rows if c.uuid == "GPU-a" and c.state == "busy"]
    assert [(c.start, c.end, c.price_per_hour) for c in a_busy] == [(H - 1380, H + 48 * HOUR + 9420, 3.0)]
    assert sum(c.cost for c in rows if c.cost is not None) == Decimal(str(same["totals"]["cost"]))
    changed = _doc(parts := _three(price_tail=3.5))
    rows = charges(parts, changed)
    a_busy = [c for c in rows if c.uuid == "GPU-a" and c.state == "busy"]
    assert [(c.start, c.end, c.price_per_hour) for c in a_busy] == [
        (H - 1380, H + 48 * HOUR, 3.0),
        (H + 48 * HOUR, H + 48 * HOUR + 9420, 3.5),
    ]
    assert a_busy[1].hours == pytest.approx(1.0)
    assert changed["gpus"][0]["price_now_per_hour"] == 3.5  # the last part's price is the one now
    assert sum(c.cost for c in rows if c.cost is not None) == Decimal(str(changed["totals"]["cost"]))


def test_who_holds_a_gpu_now_is_the_last_parts() -> None:
    parts = _three()
    parts[0].results["holders_now"] = [({**B, "user": "mallory"}, 1.0)]
    parts[-1].results["holders_now"] = []
    parts[-1].results["holders_now"] = [({**B, "user": "carol"}, 1.0)]
    assert together(parts)["holders_now"] == [({**B, "user": "carol"}, 1.0)]


def test_every_part_of_a_range_is_planned_in_the_currency_of_the_whole_range() -> None:
    """Parts read apart each picked a currency of their own among several: a recorded middle whose GPUs
    are mostly USD, and a raw end where all three are EUR, planned the middle in USD while the report
    summed EUR (a KeyError, or the middle's cost left out).  Now one currency is picked over every part's
    prices, and every part is planned in it."""
    from gpu_exporter.report.command import one_currency
    from gpu_exporter.report.queries import Query, Window

    middle, tail = Window(0, 7200, 3600), Window(7200, 7800, 60)
    prices = Query("prices", "prices", "gpu_price_per_hour", "range")
    priced = {middle: [("a", "USD"), ("b", "USD"), ("c", "EUR")], tail: [("a", "EUR"), ("b", "EUR"), ("c", "EUR")]}

    class Store:
        def range(self, expr: str, start: float, end: float, step: float, what: str = "") -> list[Any]:
            w = middle if start < 7200 else tail
            return [({"node": "n", "uuid": u, "currency": c}, [(end, 1.0)]) for u, c in priced[w]]

    parts = [(middle, [prices]), (tail, [prices])]
    assert one_currency(Store(), parts, None) == "EUR"  # type: ignore[arg-type]  # 4 GPU-currency rows of 6
    assert one_currency(Store(), parts, "USD") == "USD"  # type: ignore[arg-type]  # asked: no question
    assert one_currency(Store(), parts[:1], None) is None  # type: ignore[arg-type]  # one part picks its own
