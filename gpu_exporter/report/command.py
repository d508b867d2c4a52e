"""``gpu-exporter report``: the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from ..durations import parse_duration
from .catalogue import CatalogueError, load_catalogue
from .client import ClientOptions, PromClient, QueryError
from .model import build, steady_prices
from .queries import (
    Query,
    SelectorError,
    Window,
    exact_cost,
    probe,
    queries,
    scrape_interval,
    selector_matchers,
    window_for,
)
from .render import as_html, as_markdown, as_table

FORMATS = ("table", "json", "markdown", "html")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-exporter report",
        description="What the GPUs cost and wasted over a range of time, who held them, and which would do "
        "the same work for less: from any Prometheus-compatible query API (Prometheus, Thanos Query, Mimir, "
        "VictoriaMetrics) that holds gpu-exporter's metrics. Every figure is aggregated by the server.",
    )
    p.add_argument("--prometheus.url", dest="url", required=True, metavar="URL", help="base URL of the query API")
    p.add_argument("--since", metavar="DURATION", help="the range ends now and spans this (e.g. 1h, 7d); default 7d")
    p.add_argument("--start", metavar="TIME", help="start of the range: RFC 3339 (2026-11-01T00:00:00Z) or unix time")
    p.add_argument("--end", metavar="TIME", help="end of the range (default: now)")
    p.add_argument("--selector", metavar="'{LABEL=\"VALUE\"}'", help="only series matching these label matchers")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--output", type=Path, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--currency", metavar="CODE", help="the currency to report where GPUs are priced in several")
    p.add_argument("--catalogue", type=Path, metavar="FILE", help="cards right-sizing may suggest (default: shipped)")
    p.add_argument(
        "--min-saving",
        type=float,
        default=0.0,
        metavar="AMOUNT",
        help="suggest only what saves at least this much a month (default 0)",
    )
    p.add_argument(
        "--min-saving-ratio",
        type=float,
        default=0.2,
        metavar="RATIO",
        help="suggest only what saves at least this share of the GPU's cost (default 0.2)",
    )
    p.add_argument("--prometheus.bearer-token-file", dest="bearer_token_file", type=Path, metavar="FILE")
    p.add_argument("--prometheus.username", dest="username", metavar="USER", help="basic auth user")
    p.add_argument(
        "--prometheus.password-file",
        dest="password_file",
        type=Path,
        metavar="FILE",
        help="basic auth password, from a file",
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
        help="how long one query may take (default 2m)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
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


def time_range(args: argparse.Namespace, now: float) -> tuple[float, float]:
    if args.since and args.start:
        raise UsageError("give --since or --start, not both")
    end = parse_time(args.end, "--end") if args.end else now
    if args.start:
        start = parse_time(args.start, "--start")
    else:
        try:
            span = float(parse_duration(args.since or "7d"))
        except ValueError as e:
            raise UsageError(f"--since: {e}") from e
        start = end - span
    if start >= end:
        raise UsageError("the range is empty: the start must be before the end")
    return start, end


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
                waiting = ", ".join(self.running)
            if waiting:
                self.say(f"still waiting for {waiting} ({time.monotonic() - self.t0:.0f} s)")


def run_queries(client: PromClient, w: Window, matchers: str, qs: list[Query], progress: Progress) -> dict[str, Any]:
    def one(q: Query) -> Any:
        progress.started(q.what)
        try:
            if q.kind == "range":
                return client.range(q.expr, w.start + w.step, w.end, w.step)
            return client.instant(q.expr, w.end)
        except QueryError as e:
            raise QueryError(f"{q.what}: {e}") from e

    results: dict[str, Any] = {}
    # A few at a time: the server works on each in parallel, and no fleet's server is hit by a burst.
    with ThreadPoolExecutor(max_workers=4) as pool:
        pending = {pool.submit(one, q): q for q in qs}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                q = pending.pop(f)
                results[q.key] = f.result()
                progress.finished(q.what)
                if q.key == "prices" and (varying := steady_prices(w, results)[1]):
                    # Hours x price is exact only where one price held throughout: the others, step by step.
                    exact = exact_cost(w, matchers, varying)
                    progress.total += 1
                    pending[pool.submit(one, exact)] = exact
    return results


def write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    output = output.resolve()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the report from whoever it is for
        os.replace(tmp, output)
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e.strerror or e}") from e


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "json": lambda doc: json.dumps(doc, indent=2),
    "table": as_table,
    "markdown": as_markdown,
    "html": as_html,
}


def main(argv: Sequence[str], now: Callable[[], float] = time.time) -> int:
    args = build_parser().parse_args(argv)
    try:
        start, end = time_range(args, now())
        matchers = selector_matchers(args.selector)
        timeout = float(parse_duration(args.timeout))
        catalogue = load_catalogue(args.catalogue)
        client = PromClient(ClientOptions(args.url, args.bearer_token_file, args.username, args.password_file,
                                          args.ca_file, args.insecure, timeout))  # fmt: skip
        if args.password_file and not args.username:
            raise UsageError("--prometheus.password-file needs --prometheus.username")
    except (UsageError, SelectorError, CatalogueError, QueryError, ValueError) as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    try:
        counts = [client.instant(probe(matchers, window), end) for window in ("1h", "1m")]
        per_hour, per_minute = (c[0][1] if c else None for c in counts)
        w = window_for(start, end, scrape_interval(per_hour, per_minute))
        qs = queries(w, matchers)
        progress = Progress(None if args.quiet else sys.stderr, len(qs))
        progress.say(f"{len(qs)} queries to {args.url} over {w.hours:g} h ({w.points} steps of {w.step} s)")
        with progress:
            results = run_queries(client, w, matchers, qs, progress)
        doc = build(w, results, catalogue, currency=args.currency.upper() if args.currency else None,
                    min_saving=args.min_saving, min_saving_ratio=args.min_saving_ratio)  # fmt: skip
    except QueryError as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    if not doc["gpus"]:
        progress.say(f"no gpu-exporter series in the range{' matching ' + args.selector if args.selector else ''}")
    try:
        write(RENDERERS[args.format](doc), args.output)
    except UsageError as e:
        print(f"gpu-exporter report: {e}", file=sys.stderr)
        return 2
    progress.say(f"done in {time.monotonic() - progress.t0:.1f} s")
    return 0
