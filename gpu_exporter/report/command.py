"""``gpu-exporter report``: the command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ..settings.durations import parse_duration
from ..untrusted import for_terminal
from . import shards as sharding
from .catalogue import CatalogueError, load_catalogue
from .client import MAX_ANSWER_BYTES, MAX_VALUE, PASSWORD_ENV, TOKEN_ENV, ClientOptions, PromClient, QueryError
from .cost import Part, currencies, pick_currency, plan, seen_twice
from .csv_export import as_csv
from .focus import VERSION as FOCUS_VERSION
from .focus import as_focus
from .gaps import as_json as gaps_json
from .gaps import scan
from .model import EXIT_STATUS, NO_DATA, NO_MATCH, OK, Options, build, iso
from .output import OutputError, write
from .paths import NotRecorded, Read, filled_json, reads, together
from .prices import key_problems
from .queries import (
    HOUR,
    PROBES,
    Query,
    RangeError,
    SelectorError,
    Window,
    anywhere,
    disagreeing,
    exact_cost,
    fleet,
    hours,
    other_jobs,
    presence,
    probe,
    queries,
    recorded_queries,
    scrape_interval,
    selector_matchers,
    timeline,
)
from .render import as_html, as_markdown, as_table
from .settings import ReportConfigError, ReportSettings
from .settings import load as load_report_settings

FORMATS = ("table", "json", "markdown", "html", "csv", "focus")
RECORDED_MODES = ("auto", "yes", "no")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-exporter report",
        description="What the GPUs cost and wasted over a range of time, who held them, and what to do about it: "
        "release, reclaim, or a cheaper card that does the same work at least as fast. From any Prometheus-compatible "
        "query API (Prometheus, Thanos Query, Mimir, Cortex, VictoriaMetrics) that holds gpu-exporter's metrics; every "
        "figure is aggregated by the server.",
        epilog="Exit status: 0 a report with costs; 1 the store failed or refused a query; 2 bad flags or files; "
        "3 no GPU in the range (no data, or a selector that matched nothing); 4 GPUs but no prices (in the currency "
        "asked for). The reason is written on stderr, with --quiet too.",
    )
    p.add_argument(
        "--prometheus.url",
        dest="url",
        required=True,
        metavar="URL",
        help="base URL of the query API (userinfo in it is used as basic auth and never shown)",
    )
    p.add_argument("--since", metavar="DURATION", help="the range ends now and spans this (e.g. 1h, 7d); default 7d")
    p.add_argument("--start", metavar="TIME", help="start of the range: RFC 3339 (2026-11-01T00:00:00Z) or unix time")
    p.add_argument(
        "--end", metavar="TIME", help="end of the range, not included (default: now; a later end is cut to now)"
    )
    p.add_argument("--selector", metavar="'{LABEL=\"VALUE\"}'", help="only series matching these label matchers")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="output format (default table); csv and focus (a FOCUS " + FOCUS_VERSION + " dataset, in CSV) "
        "have a row per GPU, holder, price period and state, for FinOps tools",
    )
    p.add_argument("--output", type=Path, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--currency", metavar="CODE", help="the currency to report where GPUs are priced in several")
    p.add_argument("--catalogue", type=Path, metavar="FILE", help="cards right-sizing may suggest (default: shipped)")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the exporter's config file: its pricing section prices the cards advice may suggest, and "
        "its report section sets the options below (flags win)",
    )
    p.add_argument(
        "--min-saving",
        type=float,
        metavar="AMOUNT",
        help="advise only what saves at least this much a month (default 0)",
    )
    p.add_argument(
        "--min-saving-ratio",
        type=float,
        metavar="RATIO",
        help="advise only what saves at least this share of the GPU's cost (default 0.2)",
    )
    p.add_argument(
        "--min-history",
        metavar="DURATION",
        help="the history a GPU needs for a monthly saving (default 24h); below it the advice says what "
        "it saw and gives no monthly figure",
    )
    p.add_argument(
        "--allow-slower",
        action="store_true",
        default=None,
        help="where no cheaper card is as fast, show the cheapest slower one: cost and time side by side",
    )
    p.add_argument(
        "--allow-consumer-cards",
        action="store_true",
        default=None,
        help="suggest GeForce cards too (NVIDIA's GeForce driver licence keeps them out of data centres)",
    )
    p.add_argument(
        "--prometheus.header",
        dest="headers",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="send this header with every query (repeat for more), e.g. X-Scope-OrgID=team-a",
    )
    p.add_argument(
        "--prometheus.header-file",
        dest="header_files",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="send this header with the value read from FILE (for secrets)",
    )
    p.add_argument(
        "--prometheus.bearer-token-file",
        dest="bearer_token_file",
        type=Path,
        metavar="FILE",
        help=f"bearer token, from a file (or ${TOKEN_ENV})",
    )
    p.add_argument("--prometheus.username", dest="username", metavar="USER", help="basic auth user")
    p.add_argument(
        "--prometheus.password-file",
        dest="password_file",
        type=Path,
        metavar="FILE",
        help=f"basic auth password, from a file (or ${PASSWORD_ENV})",
    )
    p.add_argument(
        "--prometheus.ca-file",
        dest="ca_file",
        type=Path,
        metavar="FILE",
        help="CA certificates to verify the server's certificate",
    )
    p.add_argument(
        "--prometheus.insecure-skip-verify",
        dest="insecure",
        action="store_true",
        help="do not verify the server's certificate",
    )
    p.add_argument(
        "--prometheus.timeout",
        dest="timeout",
        default="2m",
        metavar="DURATION",
        help="how long one try of a query may take, connecting to the last byte (default 2m)",
    )
    p.add_argument(
        "--prometheus.max-answer-mib",
        dest="max_answer_mib",
        type=int,
        default=MAX_ANSWER_BYTES // 1048576,
        metavar="MIB",
        help=f"the largest answer read, in MiB (default {MAX_ANSWER_BYTES // 1048576}); the series the report holds "
        "from all its answers together are bounded by one and a half times that, as they cost in memory "
        "(some 32,000 series by default)",
    )
    p.add_argument(
        "--prometheus.shard-gpus",
        dest="shard_gpus",
        type=int,
        default=sharding.SHARD_GPUS,
        metavar="N",
        help="where the hourly recorded series are read, ask at most this many GPUs per query (default "
        f"{sharding.SHARD_GPUS}): a store's bound on the series one query touches then holds for any fleet; "
        "lower it where a store refuses a query for its size",
    )
    p.add_argument(
        "--prometheus.recorded",
        dest="recorded",
        choices=RECORDED_MODES,
        metavar="auto|yes|no",
        help="read the hourly series that alerts/gpu-report.rules.yml records, where they cover the range: a "
        "range of 1 to 30 days on whole hours, ended 2 h ago or more, or the whole hours of one (--since 30d) "
        "with its ends read raw (auto, the default: else the raw series); yes: fail where they cover no "
        "part of it; no: always the raw series",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (why a report is empty still is)")
    return p  # fmt: skip


class UsageError(Exception):
    pass


def parse_time(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise UsageError(f"{flag} {text!r} is neither RFC 3339 (2026-11-01T00:00:00Z) nor unix time") from e
    if t.tzinfo is None:
        raise UsageError(f"{flag} {text!r} needs a time zone, e.g. 2026-11-01T00:00:00Z")
    return t.timestamp()


@dataclass(frozen=True)
class Range:
    start: float
    end: float
    requested_end: float | None = None  # an end in the future, cut to now


def time_range(args: argparse.Namespace, now: float) -> Range:
    """[start, end) as asked, in whole seconds; an end in the future is cut to the last whole minute
    (the store has nothing after now, and a step past now would count no hours)."""
    if args.since and args.start:
        raise UsageError("give --since or --start, not both")
    end = parse_time(args.end, "--end") if args.end else math.floor(now)
    requested = None
    if end > now:
        requested, end = end, math.floor(now / 60) * 60
    if args.start:
        start = parse_time(args.start, "--start")
    else:
        try:
            span = float(parse_duration(args.since or "7d"))
        except ValueError as e:
            raise UsageError(f"--since: {e}") from e
        start = (requested if requested is not None else end) - span
    if start >= end:
        if requested is not None:
            raise UsageError(f"the range starts at {iso(start)}, after now: nothing has happened in it yet")
        raise UsageError("the range is empty: the start must be before the end")
    return Range(start, end, requested)


class Progress:
    """One line on stderr per query as it finishes, and a line every few seconds while one runs long."""

    def __init__(self, out: TextIO | None, total: int, every: float = 5.0) -> None:
        self.out, self.total, self.every = out, total, every
        self.done = 0
        self.t0 = time.monotonic()
        self.running: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)

    def say(self, line: str) -> None:
        if self.out is not None:
            print(f"gpu-exporter report: {line}", file=self.out, flush=True)

    def __enter__(self) -> Progress:
        if self.out is not None:
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def started(self, what: str) -> None:
        with self._lock:
            self.running[what] = time.monotonic()

    def finished(self, what: str) -> None:
        with self._lock:
            took = time.monotonic() - self.running.pop(what, time.monotonic())
            self.done += 1
            self.say(f"[{self.done}/{self.total}] {what}: {took:.1f} s")

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                running = list(self.running)
            waiting = ", ".join(running[:4]) + (f" and {len(running) - 4} more" if len(running) > 4 else "")
            if waiting:
                self.say(f"still waiting for {waiting} ({time.monotonic() - self.t0:.0f} s)")


# The answers that plan the rest: where prices changed, which GPUs need every step's, and whether a GPU
# was seen through two scrapers.
PLANNED_FROM = frozenset({"prices", "priced_steps", "seen", "other_jobs"})


def ask(client: PromClient, w: Window, q: Query) -> Any:
    """One query's answer over window ``w``, an error naming the query."""
    try:
        if q.kind == "range":
            got = client.range(q.expr, w.start + w.step + q.shift, w.end + q.shift, w.step, q.what)
            return [(labels, points.shifted(-q.shift)) for labels, points in got] if q.shift else got
        return client.instant(q.expr, w.at if q.at is None else q.at, q.what)
    except QueryError as e:
        raise QueryError(f"{q.what}: {e}") from e


def one_currency(client: PromClient, parts: list[tuple[Window, list[Query]]], asked: str | None) -> str | None:
    """The currency every part of a range is planned in: the one asked for, else the one most GPUs are
    priced in over the whole range.  Each part picking its own among several planned its money in one
    currency and the report summed it in another (a KeyError, or a part's cost dropped)."""
    if asked is not None or len(parts) < 2:
        return asked
    prices = [row for w, qs in parts for q in qs if q.key == "prices" for row in ask(client, w, q)]
    return pick_currency({"prices": prices}, None)


def run_queries(client: PromClient, w: Window, matchers: str, asked: Callable[[str], list[Query]],
                progress: Progress, currency: str | None, recorded: bool = False,
                cut: Sequence[sharding.Shard] = (sharding.WHOLE,)) -> dict[str, Any]:  # fmt: skip
    """The answers of a part of the range: ``asked``'s queries (given the matchers), then, once the prices
    and the targets are in, the hours, the timeline and what they call for.  Each is asked of every
    shard of the fleet in ``cut`` (``shards.shards``) and the shards' answers put together."""

    def one(q: Query) -> Any:
        # Finished where it finishes: the main thread may be busy putting answers together meanwhile.
        progress.started(q.what)
        answer = ask(client, w, q)
        progress.finished(q.what)
        return answer

    def of_shard(qs: list[Query], n: int) -> list[Query]:
        """Where there are shards, each query says its shard: in progress lines and in errors."""
        return qs if len(cut) == 1 else [replace(q, what=f"{q.what}, GPUs {n + 1}/{len(cut)}") for q in qs]

    got: dict[str, list[Any]] = defaultdict(list)
    results: dict[str, Any] = {}
    # A few at a time: the server works on each in parallel, and no fleet's server is hit by a burst.
    with ThreadPoolExecutor(max_workers=4) as pool:
        pending = {pool.submit(one, q): q for n, shard in enumerate(cut)
                   for q in of_shard(asked(sharding.within(matchers, shard.matcher)), n)}  # fmt: skip
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                q = pending.pop(f)
                got[q.key].append(f.result())
                if len(got[q.key]) < len(cut):
                    continue
                results[q.key] = sharding.together(q.key, got.pop(q.key))
                if q.key not in PLANNED_FROM or not set(results) >= PLANNED_FROM:
                    continue
                # The prices say where to cut the range for the hours, and which GPUs need every step's;
                # the targets, whether any GPU was seen through two scrapers, to be counted once.
                picked = pick_currency(results, currency)  # several and none asked for: stop here
                p = plan(w, results, picked)
                copies = seen_twice(results)
                more: list[Query] = []
                for n, shard in enumerate(cut):
                    m = sharding.within(matchers, shard.matcher)
                    mine = [*(hours(w, m, a, b, copies, recorded) for a, b in p.pieces),
                            timeline(w, m, copies, recorded)]  # fmt: skip
                    # Priced step by step: the GPUs of this shard's (a fleet asked whole: all of them).
                    exact = sorted(u for u in p.exact.values() if not shard.matcher or u in shard.uuids)
                    if exact:
                        assert picked is not None
                        mine.append(exact_cost(w, m, exact, picked, copies, recorded))
                    if copies and results["other_jobs"]:  # other jobs' copies: which disagree, to name them
                        mine.append(disagreeing(w, m, recorded))
                    more += of_shard(mine, n)
                progress.total += len(more) - 2 * len(cut)  # the hours and the timeline were counted from the start
                pending.update({pool.submit(one, x): x for x in more})
    return results


def cut_fleet(client: PromClient, planned: list[Read], matchers: str, size: int) -> list[sharding.Shard]:
    """The shards the fleet is asked in (``shards.shards``): its GPUs, by UUID, from each part's own series."""
    uuids: set[str] = set()
    for r in planned:
        q = fleet(r.w, matchers, r.recorded)
        uuids |= {labels.get("uuid", "") for labels, _ in ask(client, r.w, q)}
    return sharding.shards(uuids, size)


def _count(rows: list[tuple[dict[str, str], float]], window: str) -> float | None:
    """The probe's answer, judged for its shape before it becomes the scrape interval: one series
    without labels (a max over every GPU) whose value is a whole count of samples, or none."""
    what = f"the scrape interval's probe (samples in {window})"
    if not rows:
        return None
    if len(rows) != 1 or rows[0][0]:
        first = for_terminal(repr(rows[0][0]))[:120]
        raise QueryError(f"{what}: a max over every GPU is one series without labels; the store sent {len(rows)}, "
                         f"the first labelled {first}: is it Prometheus-compatible?")  # fmt: skip
    v = rows[0][1]
    if v < 1 or v != int(v):
        raise QueryError(f"{what}: a count of samples is a whole number of at least 1; the store sent {v!r}")
    return v


def _asked(r: Read, matchers: str, last: bool) -> list[Query]:
    """What a part of the range is asked (of a shard, given its matchers): who holds each GPU now only
    of the last part."""
    qs = [*(recorded_queries(r.w, matchers) if r.recorded else queries(r.w, matchers)),
          other_jobs(r.w, matchers, r.recorded)]  # fmt: skip
    return qs if last else [q for q in qs if q.key != "holders_now"]


def why_empty(client: PromClient, w: Window, matchers: str, selector: str | None) -> tuple[str, str]:
    """Why no GPU came back: a selector that matched nothing, or no data in the range (and whether the
    store holds gpu-exporter's series at all)."""
    span = f"from {iso(w.start)} to {iso(w.end)}"
    if matchers:
        (found,) = client.instant(presence("", w), w.at) or [({}, 0.0)]
        if found[1] > 0:
            return NO_MATCH, f"the selector {selector} matched none of the {found[1]:.0f} GPUs in the store {span}"
    now = client.instant(anywhere(""), time.time())
    if now and now[0][1] > 0:
        return NO_DATA, (f"no gpu-exporter data {span}; the store has {now[0][1]:.0f} GPUs' series now: is the range "
                         "right?")  # fmt: skip
    return NO_DATA, (f"no gpu-exporter data {span}, nor now: is this store scraping gpu-exporter (its "
                     "gpu_state_seconds_total series)?")  # fmt: skip


# The formats FinOps tools read: charges per GPU, holder and price period, which the JSON does not hold, so
# they are worked out from the query results too.
EXPORTS: dict[str, Callable[[list[Part], dict[str, Any]], str]] = {"csv": as_csv, "focus": as_focus}
RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "json": lambda doc: json.dumps(doc, indent=2),
    "table": as_table,
    "markdown": as_markdown,
    "html": as_html,
}


def _pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, eq, value = v.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"{flag} takes NAME=VALUE (got a value without '=' or a name)")
        out.append((name.strip(), value))
    return out


def _recorded_mode(args: argparse.Namespace) -> str:
    """--prometheus.recorded, else the config file's report.recorded, else auto."""
    if args.recorded is not None:
        return str(args.recorded)
    return load_report_settings(args.config)[0].recorded if args.config is not None else "auto"


def _options(args: argparse.Namespace) -> tuple[Options, float]:
    """The advice options: flags, else the config file's report section, else the defaults; and the timeout."""
    report, pricing = ReportSettings(), None
    if args.config is not None:
        report, pricing = load_report_settings(args.config)
    min_history = report.min_history
    if args.min_history is not None:
        try:
            min_history = float(parse_duration(args.min_history))
        except ValueError as e:
            raise UsageError(f"--min-history: {e}") from e
        if min_history <= 0:
            raise UsageError("--min-history must be more than 0")
    for flag, value in (("--min-saving", args.min_saving), ("--min-saving-ratio", args.min_saving_ratio)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be a number of 0 or more (got {value:g})")
    if args.min_saving_ratio is not None and args.min_saving_ratio > 1:
        raise UsageError(f"--min-saving-ratio is a share of the cost, from 0 to 1 (got {args.min_saving_ratio:g})")
    try:
        timeout = float(parse_duration(args.timeout))
    except ValueError as e:
        raise UsageError(f"--prometheus.timeout: {e}") from e
    if timeout <= 0:
        raise UsageError(f"--prometheus.timeout must be more than 0 s (got {args.timeout!r})")
    if not 1 <= args.shard_gpus <= 1_000_000:
        raise UsageError(f"--prometheus.shard-gpus must be from 1 to 1000000 (got {args.shard_gpus})")
    if not 1 <= args.max_answer_mib <= 65536:
        raise UsageError(f"--prometheus.max-answer-mib must be from 1 to 65536 (got {args.max_answer_mib})")
    opts = Options(
        currency=args.currency.upper() if args.currency else None,
        pricing=pricing,
        min_saving=report.min_saving if args.min_saving is None else args.min_saving,
        min_saving_ratio=report.min_saving_ratio if args.min_saving_ratio is None else args.min_saving_ratio,
        min_history_hours=min_history / 3600,
        allow_slower=report.allow_slower if args.allow_slower is None else args.allow_slower,
        allow_consumer=report.allow_consumer_cards if args.allow_consumer_cards is None else args.allow_consumer_cards,
    )
    return opts, timeout


def main(argv: Sequence[str], now: Callable[[], float] = time.time,
         environ: Mapping[str, str] | None = None) -> int:  # fmt: skip
    args = build_parser().parse_args(argv)
    try:
        span = time_range(args, now())
        matchers = selector_matchers(args.selector)
        opts, timeout = _options(args)
        catalogue = load_catalogue(args.catalogue)
        refused, doubtful = key_problems(opts.pricing.models, catalogue) if opts.pricing else ([], [])
        if refused:
            raise UsageError(f"{args.config}: {'; '.join(refused)}")
        for said in doubtful:
            print(f"gpu-exporter report: warning: {args.config}: {said}", file=sys.stderr)
        client = PromClient(ClientOptions(
            args.url, args.bearer_token_file, args.username, args.password_file, args.ca_file, args.insecure, timeout,
            tuple(_pairs(args.headers, "--prometheus.header")),
            tuple((n, Path(v)) for n, v in _pairs(args.header_files, "--prometheus.header-file")),
            os.environ if environ is None else environ, max_answer_bytes=args.max_answer_mib * 1048576,
        ))  # fmt: skip
    except (UsageError, SelectorError, CatalogueError, QueryError, ReportConfigError, RangeError) as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    say = Progress(sys.stderr, 0)  # what must be said, --quiet or not
    try:
        probed: list[float] = []  # the scrape interval, asked of the store once, where a part is read raw

        def interval() -> float:
            if not probed:
                counts = [_count(client.instant(probe(matchers, w), span.end), w) for w in PROBES]
                probed.append(scrape_interval(*counts))
            return probed[0]

        planned, said = reads(client, _recorded_mode(args), span.start, span.end, now(), interval)
        asked = planned[0].w
        if len(planned) == 1 and not planned[0].recorded:
            planned = [Read(asked.from_epoch(), False)]
        # A large fleet read from the recorded series is asked in shards of GPUs (``shards``).
        cut = cut_fleet(client, planned, matchers, args.shard_gpus) if any(r.recorded for r in planned) else \
            [sharding.WHOLE]  # fmt: skip
        asks = [_asked(r, matchers, last=n == len(planned) - 1) for n, r in enumerate(planned)]
        total = sum(len(qs) + 2 for qs in asks) * len(cut)  # the hours and the timeline of each part come later
        sharded = f", the GPUs in {len(cut)} shards" if len(cut) > 1 else ""
        progress = Progress(None if args.quiet else sys.stderr, total)
        progress.say(said)
        if span.requested_end is not None:
            say.say(f"the range ended in the future ({iso(span.requested_end)}): cut to now, {iso(span.end)}")
        if planned[0].w != asked:
            say.say(f"the range started before any store holds samples ({iso(asked.start)}): cut to "
                    f"{iso(planned[0].w.start)}")  # fmt: skip
        if len(planned) == 1:
            w = planned[0].w
            progress.say(
                f"{total} queries to {client.shown} over {w.hours:g} h ({w.points} steps of {w.step} s){sharded}"
            )
        else:
            w = Window(planned[0].w.start, planned[-1].w.end, HOUR)
            progress.say(f"{total} queries to {client.shown} over {w.hours:g} h, in {len(planned)} parts{sharded}")
        currency = one_currency(client, [(r.w, qs) for r, qs in zip(planned, asks, strict=True)], opts.currency)
        with progress:
            parts = [Part(r.w, run_queries(client, r.w, matchers, partial(_asked, r, last=n == len(planned) - 1),
                                           progress, currency, r.recorded, cut))
                     for n, r in enumerate(planned)]  # fmt: skip
            gaps = scan(client, [r.w for r in planned if not r.recorded], matchers)
        results = parts[0].results if len(parts) == 1 else together(parts)
        longest = max(parts, key=lambda p: p.w.hours).w
        empty = None if any(v for p in parts for k, v in p.results.items() if k.startswith("hours")) else \
            why_empty(client, longest, matchers, args.selector)  # fmt: skip
        doc = build(
            w,
            results,
            catalogue,
            replace(
                opts,
                requested_end=span.requested_end,
                empty_because=empty,
                requested_start=None if planned[0].w == asked else asked.start,
            ),
            parts=None if len(parts) == 1 else parts,
        )
        doc["store_gaps"] = gaps_json(gaps)
        if any(r.recorded for r in planned):
            doc["recorded"] = filled_json(planned)
    except (QueryError, NotRecorded) as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 1
    except (ValueError, RangeError) as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    if doc["status"] != OK:
        say.say(doc["status_reason"])
    if client.bad_currencies:
        shown = "; ".join(client.bad_currencies[:3]) + ("; ..." if len(client.bad_currencies) > 3 else "")
        say.say(f"{len(client.bad_currencies)} series from the store had a currency label the exporter never writes "
                f"(a letter, then at most 9 letters or digits) and are left out of the money: {shown}")  # fmt: skip
    if opts.currency is None and doc["currency"] and len(found := currencies(results)) > 1:
        say.say(f"the GPUs are priced in several currencies ({', '.join(found)}): the money is in {doc['currency']}, "
                "the one most GPUs are priced in; the others' GPUs are left out of it (--currency picks)")  # fmt: skip
    if client.impossible:
        say.say(f"{client.impossible} values from the store were impossible (negative, or past {MAX_VALUE:g}) and are "
                "left out: is it a gpu-exporter store, and is its data intact?")  # fmt: skip
    try:
        text = EXPORTS[args.format](parts, doc) if args.format in EXPORTS else RENDERERS[args.format](doc)
        write(text, args.output)
    except (UsageError, OutputError) as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    size, what = client.largest
    shown = f"{size / 1024:.0f} KiB" if size < 1048576 else f"{size / 1048576:.1f} MiB"
    progress.say(f"done in {time.monotonic() - progress.t0:.1f} s; the largest answer ({what}) was {shown} of the "
                 f"{args.max_answer_mib:g} MiB that --prometheus.max-answer-mib allows")  # fmt: skip
    return EXIT_STATUS[doc["status"]]
