"""A large fleet asked in shards of GPUs: how the GPUs are cut, and how the shards' answers come
together (the report's figures from a sharded read equal an unsharded one's: tests/test_report_recorded.py)."""

from __future__ import annotations

import hashlib
import re

import pytest

from gpu_exporter.report.client import Points
from gpu_exporter.report.shards import Shard, shards, together, within


def matches(shard: Shard, uuid: str) -> bool:
    """Whether the store would give ``uuid``'s series to this shard: PromQL reads the matcher's string
    (a quote or backslash in it escaped), then matches the whole value (RE2, whose escapes agree with
    Python's for these)."""
    m = re.fullmatch(r'uuid=~"((?:[^"\\]|\\.)*)"', shard.matcher)
    assert m, f"not one PromQL string: {shard.matcher}"
    regex = re.sub(r'\\(["\\])', r"\1", m.group(1))
    return re.fullmatch(regex, uuid) is not None


def test_a_fleet_within_one_shard_is_asked_whole() -> None:
    assert [s.matcher for s in shards({f"GPU-{i}" for i in range(500)}, 500)] == [""]
    assert [s.matcher for s in shards(set(), 500)] == [""]
    assert [s.matcher for s in shards({f"GPU-{i}" for i in range(501)}, 500)] != [""]


def fleet(n: int) -> set[str]:
    return {f"GPU-{hashlib.md5(str(i).encode()).hexdigest()[:8]}-1111-2222-3333-444455556666" for i in range(n)}


@pytest.mark.parametrize("uuids", [
    fleet(1001),
    {f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(1001)},  # one long common prefix
    {"GPU-1", "GPU-12", "GPU-123", "GPU-13", "GPU-2", ""} | {f"GPU-1{i}" for i in range(300)},  # prefixes of others
], ids=["random", "sequential", "nested"])  # fmt: skip
def test_each_gpu_falls_in_exactly_one_shard_of_at_most_the_size(uuids: set[str]) -> None:
    cut = shards(uuids, 100)
    assert len(cut) >= len(uuids) / 100
    for u in uuids:
        assert [s for s in cut if matches(s, u)] == [s for s in cut if u in s.uuids], u
        assert sum(u in s.uuids for s in cut) == 1, u
    assert max(len(s.uuids) for s in cut) <= 100
    assert cut == shards(set(uuids), 100)  # the same cut every run
    # Short, whatever the UUIDs: VictoriaMetrics refuses a query past 16 KiB, and a query repeats its selector.
    assert max(len(s.matcher) for s in cut) < 1000


@pytest.mark.parametrize("uuids", [
    fleet(1001), {f"GPU-{i:08x}-0000" for i in range(1001)}, {f"GPU-1{i}" for i in range(300)},
], ids=["random", "sequential", "nested"])  # fmt: skip
def test_a_gpu_the_fleet_query_did_not_list_still_falls_in_exactly_one_shard(uuids: set[str]) -> None:
    """An exporter that writes no "down" series is not listed: its GPUs' series must still be read once."""
    cut = shards(uuids, 100)
    late = [
        "",
        "GPU-",
        "GPU-1",
        "GPU-00000000-new",
        "GPU-ffffffff-new",
        "GPU-7",
        "GPU-1x",
        "MIG-1",
        "]",
        "-",
        "\\",
        "GPU-X",
        "GPU-0X",
        "GPU-1X",
        "X",
    ]
    for u in [*late, *(x + "z" for x in uuids), *(x[:-1] for x in uuids)]:
        assert sum(matches(s, u) for s in cut) == 1, u


def test_a_uuid_with_regex_or_quote_characters_matches_itself_alone() -> None:
    odd = 'GPU-1.2|x"y\\z'
    cut = shards({odd, "GPU-2", 'GPU-112|x"y\\z'}, 1)
    (mine,) = [s for s in cut if odd in s.uuids]
    assert matches(mine, odd)
    assert not matches(mine, 'GPU-112|x"y\\z') and not matches(mine, "GPU-1")


def test_a_shard_adds_its_matcher_to_the_selector() -> None:
    assert within("", "") == ""
    assert within('node="a"', "") == 'node="a"'
    assert within("", 'uuid=~"x"') == 'uuid=~"x"'
    assert within('node="a"', 'uuid=~"x"') == 'node="a", uuid=~"x"'


def test_rows_of_the_shards_are_put_side_by_side() -> None:
    a = [({"uuid": "GPU-a", "state": "busy"}, 3.0)]
    b = [({"uuid": "GPU-b", "state": "busy"}, 4.0), ({"uuid": "GPU-b", "state": "idle"}, 1.0)]
    assert together("hours", [a, b]) == a + b
    assert together("hours", [a]) is a


def test_the_timeline_of_the_shards_is_added_up_at_each_point() -> None:
    a = [({"state": "busy"}, Points([(3600.0, 2.0), (7200.0, 1.0)])), ({"state": "idle"}, Points([(3600.0, 1.0)]))]
    b = [({"state": "busy"}, Points([(3600.0, 0.5), (10800.0, 4.0)]))]
    got = {labels["state"]: list(points) for labels, points in together("timeline", [a, b])}
    assert got == {"busy": [(3600.0, 2.5), (7200.0, 1.0), (10800.0, 4.0)], "idle": [(3600.0, 1.0)]}


def test_a_prefix_of_exactly_the_size_is_one_short_regex_and_shards_are_filled() -> None:
    """Packed in order: A's and B's 50 GPUs fill the first shard of 100, C's the second; each group one
    prefix (``A.*``), never its GPUs one by one."""
    groups = {g: {f"{g}{i:03d}" for i in range(n)} for g, n in (("A", 50), ("B", 50), ("C", 100))}
    cut = shards(set().union(*groups.values()), 100)
    assert [s.uuids for s in cut] == [groups["A"] | groups["B"], groups["C"]]
    assert all(len(s.matcher) < 60 for s in cut), [s.matcher for s in cut]


def test_uuids_that_differ_at_a_quote_or_backslash_are_told_apart() -> None:
    uuids = {'a"1', 'a"2', "a\\1", "a\\2", "a3"}
    cut = shards(uuids, 1)
    for u in [*uuids, 'a"', 'a"3', "a\\", "a4", "a", "aX"]:
        assert sum(matches(s, u) for s in cut) == 1, u
    for u in uuids:
        (mine,) = [s for s in cut if u in s.uuids]
        assert matches(mine, u), (u, mine.matcher)
