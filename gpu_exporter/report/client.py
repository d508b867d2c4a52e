"""A client for the Prometheus HTTP query API, as Prometheus, Thanos Query, Mimir, Cortex and
VictoriaMetrics serve it: instant and range queries by POST, with the options Prometheus tooling has
(bearer token, basic auth, CA file, timeout), any headers a store needs (``X-Scope-OrgID`` for a
Mimir or Cortex tenant), and bounded retries with backoff where the store says to come back later.

Secrets never reach a message: the password of a URL's userinfo is taken out of the URL before
anything names it, and header values are never printed.  Nor do they reach another server: a
redirect is followed only within the store's own origin (scheme, host and port), since urllib
would carry ``Authorization`` and the tenant header to wherever a store points.

A store that lies cannot hold the report or its memory: one try of a query, from connecting to the
last byte, has ``timeout`` in all (a socket timeout bounds each read, and a store that drips a byte
a second never trips one), and an answer is read to at most ``max_answer_bytes``.  Nor is an answer
ever held whole: it is decoded as it arrives, a series at a time, into the report's own compact form
(labels whose names and values are shared, points as an array of doubles), and the series the
report keeps from all its answers together are bounded too (``max_kept_bytes``), since many small
series cost far more in memory than their bytes (issue 50: 200,000 series in a 47 MB answer took
815 MiB).
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import http.client
import json
import math
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, overload

from ..accounting.settings import CURRENCY as CURRENCY_PATTERN
from ..settings.yamlfile import MAX_SECRET_BYTES, read_bounded
from ..untrusted import for_terminal

Labels = dict[str, str]

RETRIES = 3  # after the first try: four in all
BACKOFF_S = 1.0  # then 2 s, then 4 s
MAX_WAIT_S = 30.0  # the longest Retry-After honoured
TOKEN_ENV = "GPU_EXPORTER_PROMETHEUS_BEARER_TOKEN"
PASSWORD_ENV = "GPU_EXPORTER_PROMETHEUS_PASSWORD"
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110's token
CURRENCY = re.compile(CURRENCY_PATTERN)
_OWN_HEADERS = {"content-type", "content-length", "host", "accept", "user-agent"}
# An answer is decoded as it arrives, never held whole: 128 MiB is some 2 million samples, far past what
# one query of a report of hundreds of GPUs returns, and a bound a report of thousands can raise.
MAX_ANSWER_BYTES = 128 * 1024 * 1024
# What the report keeps of all its answers together is bounded too, by what it costs at the report's
# peak: a series 6 KiB (its labels and value decoded are some 500 bytes; the model built from it and
# the rendered output take the rest: 5.5 KiB a series at 40,000 series, benchmarks/report_memory.py)
# and a point 128 bytes (16 in its array; the prices' plan, ``cost.plan``, holds each in a dict for a
# while: some 100 bytes a point at 2 million).  The bound is one and a half times the answer bound,
# 192 MiB by default, some 32,000 series or 1.5 million points: a peak under 256 MiB with the
# interpreter's 45.  Past it the report stops, naming the query and the bound, rather than grow with
# a store's series (issue 50: 200,000 small series in a 47 MB answer took 815 MiB).
SERIES_COST = 6 * 1024
POINT_COST = 128
READ_CHUNK = 256 * 1024
# One series of an answer, as JSON, at most: its labels, and a point per step of the query (each
# ``[1700000000.123,"1.2345678901234567e+18"]`` at most, which is 44 bytes).  A series past it is
# no series a store computed for the query, and decoding it whole would cost some ten times its size.
MAX_LABELS_BYTES = 64 * 1024
MAX_POINT_BYTES = 64
MAX_ERROR_BYTES = 64 * 1024  # of a refusal's body: its first 300 characters are shown
MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)


class QueryError(Exception):
    """The API could not be reached or refused a query; the message says which and why."""


class TooManySeries(QueryError):
    """The series of the answers so far passed what the report holds: it stops reading at once."""


@dataclass(frozen=True)
class ClientOptions:
    url: str
    bearer_token_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    timeout: float = 120.0
    headers: tuple[tuple[str, str], ...] = ()  # (name, value)
    header_files: tuple[tuple[str, Path], ...] = ()  # (name, file holding the value)
    environ: Mapping[str, str] = field(default_factory=dict)  # where TOKEN_ENV and PASSWORD_ENV are read
    retries: int = RETRIES
    max_answer_bytes: int = MAX_ANSWER_BYTES
    max_kept_bytes: int | None = None  # None: one and a half times max_answer_bytes


def redact(url: str) -> str:
    """The URL without its userinfo's password: ``http://user:***@host``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _secret(path: Path, what: str) -> str:
    try:
        return read_bounded(path, MAX_SECRET_BYTES).decode("utf-8").strip()
    except OSError as e:
        raise QueryError(f"cannot read the {what} file {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise QueryError(f"the {what} file {path} is not text") from e


def _header(name: str, value: str, where: str) -> tuple[str, str]:
    if not _HEADER_NAME.match(name):
        raise QueryError(f"{where}: {name!r} is not a header name")
    if name.lower() in _OWN_HEADERS:
        raise QueryError(f"{where}: the report sets {name} itself")
    if any(c in value for c in "\r\n\0"):
        raise QueryError(f"{where}: the value of {name} holds a line break")  # the value itself is never shown
    return name, value


class PromClient:
    def __init__(self, opts: ClientOptions, sleep: Callable[[float], None] = time.sleep) -> None:
        if not opts.timeout > 0:
            raise QueryError(f"--prometheus.timeout must be more than 0 s (got {opts.timeout:g} s)")
        parsed = urllib.parse.urlsplit(opts.url)
        self.shown = redact(opts.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise QueryError(f"--prometheus.url {self.shown!r} must be an http:// or https:// URL")
        try:
            parsed.port  # noqa: B018 - raises on a port that is no number
        except ValueError as e:
            raise QueryError(f"--prometheus.url {self.shown!r} has a bad port") from e
        # The userinfo goes into the Authorization header, not onto the wire as part of the URL.
        userinfo = (urllib.parse.unquote(parsed.username or ""), urllib.parse.unquote(parsed.password or ""))
        netloc = parsed.netloc.rsplit("@", 1)[-1]
        self.base = urllib.parse.urlunsplit(parsed._replace(netloc=netloc)).rstrip("/")
        self.shown = self.shown.rstrip("/")
        self.timeout, self.retries, self.sleep = opts.timeout, opts.retries, sleep
        self.max_answer = opts.max_answer_bytes
        # One flag raises both: a machine with the memory for larger answers has it for more series.
        self.max_kept = opts.max_answer_bytes * 3 // 2 if opts.max_kept_bytes is None else opts.max_kept_bytes
        self.kept = 0  # what the series kept from every answer so far cost, as SERIES_COST and POINT_COST count it
        self.kept_series = self.kept_points = 0
        self.origin = _origin(self.base)
        self.impossible = 0  # values left out as no store could mean them (negative, past MAX_VALUE)
        # Series left out for a currency label the exporter could never have written: what each was, shown
        # escaped (issue 50: one became a CSV formula, a format string and a terminal escape).
        self.bad_currencies: list[str] = []
        # The largest answer read and what it answered: how close a report came to max_answer, which a
        # fleet reaches by its size (one series per GPU, holder and state) before any deadline.
        self.largest: tuple[int, str] = (0, "")
        self._largest_lock = threading.Lock()
        self.headers = {"Accept": "application/json", "User-Agent": "gpu-exporter-report"}
        self.headers.update(self._auth(opts, userinfo if parsed.username else None))
        for name, value in opts.headers:
            self._add(*_header(name, value, "--prometheus.header"))
        for name, path in opts.header_files:
            self._add(*_header(name, _secret(path, f"{name} header"), "--prometheus.header-file"))
        self.context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            try:
                self.context = ssl.create_default_context(cafile=str(opts.ca_file) if opts.ca_file else None)
            except (OSError, ssl.SSLError) as e:
                raise QueryError(f"cannot load the CA file {opts.ca_file}: {e}") from e
            if opts.insecure_skip_verify:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def _add(self, name: str, value: str) -> None:
        if name.lower() == "authorization" and "Authorization" in self.headers:
            raise QueryError("an Authorization header and a bearer token or basic auth: give one")
        self.headers[name] = value

    @staticmethod
    def _auth(opts: ClientOptions, userinfo: tuple[str, str] | None) -> dict[str, str]:
        token_env = opts.environ.get(TOKEN_ENV)
        tokens = [x for x in (opts.bearer_token_file, token_env) if x]
        if len(tokens) > 1:
            raise QueryError(f"a bearer token from --prometheus.bearer-token-file and from ${TOKEN_ENV}: give one")
        users = [x for x in (opts.username, userinfo) if x]
        if tokens and users:
            raise QueryError("use a bearer token or basic auth, not both")
        if len(users) > 1:
            raise QueryError("a user in --prometheus.url and --prometheus.username: give one")
        if opts.password_file and not opts.username:
            raise QueryError("--prometheus.password-file needs --prometheus.username")
        if opts.bearer_token_file:
            return {"Authorization": "Bearer " + _secret(opts.bearer_token_file, "bearer token")}
        if token_env:
            return {"Authorization": "Bearer " + token_env.strip()}
        if userinfo is not None:
            user, password = userinfo
        elif opts.username is not None:
            user = opts.username
            password = _secret(opts.password_file, "password") if opts.password_file else opts.environ.get(
                PASSWORD_ENV, "")  # fmt: skip
        else:
            return {}
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    def _post(self, path: str, params: dict[str, str], what: str, take: Callable[[Any], None],
              element_bytes: int) -> tuple[dict[str, Any], QueryError | None]:  # fmt: skip
        """The answer's ``data``, less its ``result``, whose series went to ``take`` one at a time as
        they were read (a try is tried again only where the store refused it, before any series); and
        the first fault ``take`` found in a series, for the caller to raise once it has checked the
        envelope, as when answers were read whole."""
        url, shown = f"{self.base}/api/v1/{path}", f"{self.shown}/api/v1/{path}"
        body = urllib.parse.urlencode(params).encode()
        for attempt in range(self.retries + 1):
            try:
                answer = self._fetch(url, shown, body, take, element_bytes)
                break
            except urllib.error.HTTPError as e:
                detail = _error_text(_read_some(e, MAX_ERROR_BYTES))
                if (e.code == 429 or e.code >= 500) and attempt < self.retries:
                    self.sleep(_wait(e.headers.get("Retry-After"), attempt))
                    continue
                tried = f" (after {attempt + 1} tries)" if attempt else ""
                if e.code in (401, 403):
                    raise QueryError(f"{shown}: {e.code} {e.reason}: check the credentials ({detail})") from e
                raise QueryError(f"{shown}: {e.code} {e.reason}{tried}: {detail}") from e
            except TimeoutError as e:
                raise QueryError(f"{shown}: no answer within {self.timeout:g} s (raise --prometheus.timeout)") from e
            except urllib.error.URLError as e:
                raise QueryError(f"cannot reach {shown}: {_reason(e.reason)}") from e
            except OSError as e:  # a connection reset mid-answer
                raise QueryError(f"{shown}: the connection failed: {_reason(e)}") from e
        with self._largest_lock:
            self.largest = max(self.largest, (answer.read, what or params.get("query", "")[:60]))
        if answer.not_json:
            raise QueryError(f"{shown} did not answer with JSON: is it a Prometheus query API?")
        doc = answer.doc
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
            raise QueryError(f"{shown}: {_error_text(answer.head)}")
        return doc["data"], answer.failed

    def _fetch(self, url: str, shown: str, body: bytes, take: Callable[[Any], None], element_bytes: int) -> _Stream:
        """One try: the answer, decoded as it is read, following redirects within the store's origin, all
        of it within ``timeout`` (TimeoutError past it).  Raises HTTPError for a status that is not 2xx."""
        watch = _Watch()
        timer = threading.Timer(self.timeout, watch.fire)
        timer.daemon = True
        timer.start()
        deadline = time.monotonic() + self.timeout
        opener = urllib.request.build_opener(
            _NoRedirects(), _WatchedHttp(watch), _WatchedHttps(watch, self.context))  # fmt: skip
        try:
            for _ in range(MAX_REDIRECTS + 1):
                req = urllib.request.Request(url, data=body, method="POST", headers={
                    **self.headers, "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
                try:
                    with opener.open(req, timeout=max(deadline - time.monotonic(), 0.001)) as r:
                        raw = self._body(r, shown, take, element_bytes)
                except urllib.error.HTTPError as e:
                    if e.code not in _REDIRECTS:
                        raise
                    url = self._redirect(url, shown, e)
                    continue
                if watch.finish():
                    return raw
                raise TimeoutError  # the watch cut the answer short: what was read is not all of it
            raise QueryError(f"{shown}: more than {MAX_REDIRECTS} redirects")
        except (OSError, http.client.HTTPException, ValueError) as e:
            # Whatever a socket shut under the reader raises, the cause is the deadline.
            if not watch.finish() and not isinstance(e, urllib.error.HTTPError):
                raise TimeoutError from e
            if isinstance(e, http.client.HTTPException):
                raise OSError(f"a broken answer ({type(e).__name__})") from e
            raise
        finally:
            timer.cancel()

    def _body(self, r: http.client.HTTPResponse, shown: str, take: Callable[[Any], None],
              element_bytes: int) -> _Stream:  # fmt: skip
        limit = self.max_answer
        length = r.headers.get("Content-Length", "")
        # A length said up front is refused unread; else the read stops one chunk past the bound.
        if length.isdigit() and int(length) > limit:
            raise QueryError(_too_large(shown, limit))
        answer = _Stream(r, shown, limit, take, element_bytes)
        answer.run()
        return answer

    def _redirect(self, url: str, shown: str, e: urllib.error.HTTPError) -> str:
        """Where a redirect within the store's origin points; a QueryError for any other place."""
        location = e.headers.get("Location", "")
        if not location:
            raise QueryError(f"{shown}: a {e.code} redirect that says not where to")
        target = urllib.parse.urlsplit(urllib.parse.urljoin(url, location))
        there = _origin(urllib.parse.urlunsplit(target))
        if there != self.origin:
            downgrade = self.origin[0] == "https" and there[0] == "http"
            why = "from https to plain http" if downgrade else f"to another origin, {for_terminal(_show_origin(there))}"
            raise QueryError(
                f"{shown}: the store redirects ({e.code}) {why}; its credentials and headers go to "
                f"{_show_origin(self.origin)} only, so the report stops: give --prometheus.url as the address "
                f"it redirects to, if you trust it"
            )
        netloc = target.netloc.rsplit("@", 1)[-1]  # a userinfo in a Location is not used
        return urllib.parse.urlunsplit(target._replace(netloc=netloc))

    def instant(self, expr: str, at: float, what: str = "") -> list[tuple[Labels, float]]:
        """The vector's samples; a NaN or infinite one (an exporter's broken gauge, a 0/0) is left out:
        a figure that cannot be known is no figure, never 0, and never NaN in the report."""
        kept = _Kept(self)

        def take(r: Any) -> None:
            labels = _labels(_series(r))
            _, v = _sample(_point(r, "value"))
            if kept.first(labels) and self._sane(v):
                kept.add(labels, v, 0)

        data, failed = self._post("query", {"query": expr, "time": f"{at:.3f}"}, what, take, MAX_LABELS_BYTES)
        if data.get("resultType") != "vector":
            raise QueryError(f"expected a vector from {expr!r}, got {_shown(data.get('resultType'))}")
        return kept.done(data, failed)

    def range(self, expr: str, start: float, end: float, step: float,
              what: str = "") -> list[tuple[Labels, Points]]:  # fmt: skip
        kept = _Kept(self)
        most = int((end - start) // step) + 1 if step > 0 else 1  # the points a store can have computed

        def take(r: Any) -> None:
            labels = _labels(_series(r))
            values = r.get("values")
            if not isinstance(values, list):
                raise QueryError(f"a series without its values: {_shown(r)}")
            if len(values) > most:
                raise QueryError(f"a series of {len(values):,} points from a query of {most:,} steps: "
                                 f"{_shown(labels)}")  # fmt: skip
            flat = array("d")
            for p in values:
                flat.extend(_sample(p))
            if kept.first(labels):
                points = Points.sane(flat, self._sane)
                kept.add(labels, points, len(points))

        # nocache: VictoriaMetrics would otherwise align the start to its cache's grid.
        data, failed = self._post("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{step:g}", "nocache": "1"}, what, take,
                                  MAX_LABELS_BYTES + most * MAX_POINT_BYTES)  # fmt: skip
        if data.get("resultType") != "matrix":
            raise QueryError(f"expected a matrix from {expr!r}, got {_shown(data.get('resultType'))}")
        return kept.done(data, failed)

    def _keep(self, series: int, points: int) -> None:
        """Counts what an answer keeps against ``max_kept``, for every answer together; a QueryError past it."""
        with self._largest_lock:
            self.kept += series * SERIES_COST + points * POINT_COST
            self.kept_series += series
            self.kept_points += points
            if self.kept <= self.max_kept:
                return
            n, points = self.kept_series, self.kept_points
        raise TooManySeries(
            f"more series than the report holds in memory: {n:,} with {points:,} points so far, past the "
            f"bound of {self.max_kept // SERIES_COST:,} series (each {SERIES_COST // POINT_COST} points count as one "
            f"more) that "
            f"--prometheus.max-answer-mib sets ({_mib(self.max_answer)}): narrow the report (a --selector for "
            f"some nodes, a shorter --since) or raise --prometheus.max-answer-mib where the machine has the memory "
            f"(a series takes some {SERIES_COST // 1024} KiB)"
        )

    def _vetted(self, labels: Labels) -> bool:
        """Whether a series' labels may be computed with: a ``currency`` the exporter's own settings would
        take (CURRENCY), checked here, once, where every answer is read.  A series that fails is left
        out of the money and remembered for the report to say, escaped."""
        currency = labels.get("currency")
        if currency is None or CURRENCY.fullmatch(currency):
            return True
        with self._largest_lock:
            self.bad_currencies.append(
                f"currency {_shown(currency)} on {_shown(labels.get('node', '?'))} GPU {_shown(labels.get('gpu', '?'))}"
            )
        return False

    def _sane(self, v: float) -> bool:
        """A finite value the report can count; an impossible one (negative, or past MAX_VALUE) is
        counted in ``impossible`` and left out, as a NaN is (without being counted: a 0/0 is common)."""
        if not math.isfinite(v):
            return False
        if 0.0 <= v <= MAX_VALUE:
            return True
        self.impossible += 1
        return False


# Every figure the report asks for is a count of hours or bytes, a price, a ratio or a rate: never
# negative, and never near 1e308 (whose sum overflows to infinity, which is not JSON).  A store that
# answers one lies or is broken: such a value is left out, as a NaN is.
MAX_VALUE = 1e18


class _NotJson(Exception):
    pass


_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"
_HEAD_BYTES = 64 * 1024  # an answer's start, kept for a message where it is no successful answer


class _Stream:
    """An answer's JSON, decoded as it is read: the envelope's small values whole, and each series of
    ``data.result`` on its own, handed to ``take`` and dropped, so that neither the answer's bytes nor
    Python's objects for all of it are ever held (the stdlib has no streaming parser, but
    ``raw_decode`` decodes one value where a buffer holds it).  After ``run``: ``doc``, the answer
    less its result's series (an empty list stands for them); ``read``, its size; ``head``, its first
    bytes; ``not_json``; and ``failed``, the first QueryError ``take`` raised (no later series is
    taken)."""

    def __init__(self, r: http.client.HTTPResponse, shown: str, limit: int, take: Callable[[Any], None],
                 element_bytes: int) -> None:  # fmt: skip
        self.r, self.shown, self.limit, self.take, self.element_bytes = r, shown, limit, take, element_bytes
        self.text = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.read, self.head = 0, b""
        self.doc: Any = None
        self.not_json = False
        self.failed: QueryError | None = None

    def run(self) -> None:
        try:
            self._space()
            if self._peek() == "{":
                self.doc = self._object(("data", "result"))
            else:
                self.doc = self._value()
            self._space()
            if self.pos < len(self.buf):
                raise _NotJson
        except (_NotJson, UnicodeDecodeError, RecursionError):
            self.not_json = True
            while self._more():  # to the end, as a store would be read whole: the bound still holds
                self.pos = len(self.buf)

    def _more(self) -> bool:
        """Reads a chunk onto the buffer (dropping what was decoded); False at the end of the answer."""
        if self.eof:
            return False
        chunk = self.r.read(READ_CHUNK)
        self.read += len(chunk)
        if self.read > self.limit:
            raise QueryError(_too_large(self.shown, self.limit))
        if len(self.head) < _HEAD_BYTES:
            self.head += chunk[: _HEAD_BYTES - len(self.head)]
        self.buf = self.buf[self.pos :] + self.text.decode(chunk, final=not chunk)
        self.pos = 0
        self.eof = not chunk
        return bool(chunk)

    def _space(self) -> None:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return

    def _peek(self) -> str:
        self._space()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def _expect(self, c: str) -> None:
        if self._peek() != c:
            raise _NotJson
        self.pos += 1

    def _value(self) -> Any:
        """One whole value at the buffer's position, read on until the buffer holds all of it (twice as
        much each time, so that a long one is not decoded over and over), at most ``element_bytes``."""
        self._space()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
                if end - self.pos > self.element_bytes:
                    raise self._too_long()
                if end < len(self.buf) or self.eof:  # a number that ends the buffer may go on
                    self.pos = end
                    return value
            except ValueError as e:
                if self.eof:
                    raise _NotJson from e
                if len(self.buf) - self.pos > self.element_bytes:
                    if isinstance(e, json.JSONDecodeError) and e.pos < len(self.buf) - 64 and \
                            not e.msg.startswith("Unterminated"):  # fmt: skip
                        raise _NotJson from e  # broken where it was read, not cut short by the buffer
                    raise self._too_long() from e
            want = max(READ_CHUNK, 2 * (len(self.buf) - self.pos))
            while len(self.buf) - self.pos < want and self._more():
                pass

    def _too_long(self) -> QueryError:
        return QueryError(
            f"{self.shown}: one series (or value) of the answer is longer than {_mib(self.element_bytes)}, more "
            f"than the query's labels and steps can be: is it a Prometheus query API?"
        )

    def _object(self, path: tuple[str, ...]) -> dict[str, Any]:
        """An object whose member ``path[0]`` is walked into (``data``, then its ``result``, an array
        whose elements go to ``take``); every other member is decoded whole."""
        self._expect("{")
        out: dict[str, Any] = {}
        if self._peek() == "}":
            self.pos += 1
            return out
        while True:
            if self._peek() != '"':
                raise _NotJson
            key = self._value()
            self._expect(":")
            c = self._peek()
            if path and key == path[0] and c == ("{" if len(path) > 1 else "["):
                out[key] = self._object(path[1:]) if len(path) > 1 else self._array()
            else:
                out[key] = self._value()
            c = self._peek()
            self.pos += 1
            if c == "}":
                return out
            if c != ",":
                raise _NotJson

    def _array(self) -> list[Any]:
        self._expect("[")
        if self._peek() == "]":
            self.pos += 1
            return []
        while True:
            element = self._value()
            if self.failed is None:
                try:
                    self.take(element)
                except TooManySeries:
                    raise  # nothing more of the answer is needed
                except QueryError as e:
                    self.failed = e
            del element
            c = self._peek()
            self.pos += 1
            if c == "]":
                return []
            if c != ",":
                raise _NotJson


def _too_large(shown: str, limit: int) -> str:
    return (f"{shown}: an answer of more than {_mib(limit)}: narrow the report (a shorter --since, a --selector "
            f"for some nodes) or raise --prometheus.max-answer-mib")  # fmt: skip


class _Watch:
    """The sockets of one try, shut when its time is up, so that a read blocked on them returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._fired = self._finished = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if not self._fired:
                return
        _shut(sock)

    def fire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._fired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)

    def finish(self) -> bool:
        """Ends the watch: True where the try ended in time (what it read is whole)."""
        with self._lock:
            self._finished = True
            return not self._fired


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown: an SSLSocket's would drop its TLS state under the reader.  A
    # socket closed already raises, and is shut as much as it needs to be.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _watched(base: type[http.client.HTTPConnection], watch: _Watch) -> type[http.client.HTTPConnection]:
    class Watched(base):  # type: ignore[misc, valid-type]
        def connect(self) -> None:
            super().connect()
            watch.add(self.sock)

    return Watched


class _WatchedHttp(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self.watch), req)


class _WatchedHttps(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self.watch, self.ctx = watch, context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self.watch), req, context=self.ctx)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Every redirect reaches PromClient as an HTTPError, which follows it only within the origin."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _show_origin(origin: tuple[str, str, int]) -> str:
    scheme, host, port = origin
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"


def _mib(n: int) -> str:
    return f"{n / 1048576:g} MiB" if n >= 1048576 else f"{n} bytes"


def _read_some(e: urllib.error.HTTPError, limit: int) -> bytes:
    try:
        return e.read(limit)
    except (OSError, http.client.HTTPException):
        return b""


def _shown(v: object) -> str:
    """What a store sent, for a message: short, and inert in a terminal."""
    return for_terminal(repr(v)[:120])


def _series(r: Any) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise QueryError(f"a result that is not a list of series: {_shown(r)}")
    return r


def _labels(r: dict[str, Any]) -> Labels:
    """The series' labels, their names and values interned: a fleet's series share most of them (the
    node, the state, the label names), and each is then held once, not once a series."""
    if "metric" not in r:  # both engines send it always, {} for an aggregate: its absence is no label set
        raise QueryError(f"a series without its labels (no 'metric' key): {_shown(r)}")
    metric = r["metric"]
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise QueryError(f"a series whose labels are not names and strings: {_shown(metric)}")
    return {sys.intern(k): sys.intern(v) for k, v in metric.items()}


def _point(r: dict[str, Any], key: str) -> Any:
    if key not in r:
        raise QueryError(f"a sample without its {key}: {_shown(r)}")
    return r[key]


def _sample(p: Any) -> tuple[float, float]:
    """A ``[time, value]`` pair as numbers; a QueryError naming what came where either is not one."""
    if not isinstance(p, list | tuple) or len(p) != 2:
        raise QueryError(f"a sample that is not [time, value]: {_shown(p)}")
    try:
        t = float(p[0])
    except (TypeError, ValueError):
        raise QueryError(f"a sample's time that is not a number: {_shown(p[0])}") from None
    try:
        return t, float(p[1])
    except (TypeError, ValueError):
        raise QueryError(f"a sample's value that is not a number: {_shown(p[1])}") from None


class Points(Sequence[tuple[float, float]]):
    """A series' ``(time, value)`` points, held as one array of doubles (16 bytes a point, where a list
    of tuples of floats takes 112), read as the sequence of pairs it stands for."""

    __slots__ = ("_flat",)

    def __init__(self, pairs: Iterator[tuple[float, float]] | Sequence[tuple[float, float]] = ()) -> None:
        self._flat = array("d")
        for t, v in pairs:
            self._flat.append(t)
            self._flat.append(v)

    @classmethod
    def sane(cls, flat: array[float], keep: Callable[[float], bool]) -> Points:
        """The points of ``flat`` (time, value, time, value...) whose value ``keep`` takes."""
        p = cls()
        it = iter(flat)
        for t, v in zip(it, it, strict=True):
            if keep(v):
                p._flat.append(t)
                p._flat.append(v)
        return p

    def shifted(self, by: float) -> Points:
        """The same points, each ``by`` seconds later."""
        p = Points()
        p._flat = array("d", self._flat)
        p._flat[0::2] = array("d", (t + by for t in self._flat[0::2]))
        return p

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __iter__(self) -> Iterator[tuple[float, float]]:
        it = iter(self._flat)
        return zip(it, it, strict=True)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, float]]: ...
    def __getitem__(self, i: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("point index out of range")
        i %= n
        return self._flat[2 * i], self._flat[2 * i + 1]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Points):
            return self._flat == other._flat
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


class _Kept:
    """The series of one answer as they are taken: each label set once (a store that sends the same one
    twice would count its hours twice), vetted, and counted against the client's bound as it comes."""

    def __init__(self, client: PromClient) -> None:
        self.client = client
        self.out: list[tuple[Labels, Any]] = []
        self._labels: list[Labels] = []  # every label set taken, vetted or not
        # Where each label set's hash was first seen: its hash, not the set, is what is held (a tuple of
        # its pairs would cost more than the series); two sets of one hash are told apart by equality.
        self._seen: dict[int, int | list[int]] = {}

    def first(self, labels: Labels) -> bool:
        """Whether this label set is new in the answer, and may be computed with (``_vetted``)."""
        h = hash(frozenset(labels.items()))
        at = self._seen.get(h)
        if at is not None:
            where = [at] if isinstance(at, int) else at
            if any(self._labels[i] == labels for i in where):
                return False
            self._seen[h] = [*where, len(self._labels)]
        else:
            self._seen[h] = len(self._labels)
        self._labels.append(labels)
        return self.client._vetted(labels)

    def add(self, labels: Labels, x: Any, points: int) -> None:
        self.client._keep(1, points)
        self.out.append((labels, x))

    def done(self, data: dict[str, Any], failed: QueryError | None) -> list[tuple[Labels, Any]]:
        if failed is not None:
            raise failed
        if not isinstance(data.get("result"), list):  # a list was taken series by series, and left empty
            raise QueryError(f"a result that is not a list of series: {_shown(data.get('result'))}")
        self._seen.clear()
        return self.out


def _wait(retry_after: str | None, attempt: int) -> float:
    """Retry-After (seconds or an HTTP date) where the store sends one, within MAX_WAIT_S; else doubling."""
    backoff = BACKOFF_S * float(1 << attempt)
    if not retry_after:
        return backoff
    try:
        seconds = float(retry_after)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(retry_after).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return backoff
    return min(max(seconds, 0.0), MAX_WAIT_S) if seconds == seconds else backoff


def _reason(reason: object) -> str:
    text = getattr(reason, "strerror", None) or str(reason)
    return text if text else type(reason).__name__


def _error_text(raw: bytes) -> str:
    """A store's own words for what went wrong, short and inert in a terminal (a store can send ESC).
    VictoriaMetrics quotes the whole query before its reason (``error when executing query="..." on the
    time range ...: cannot ...: ... -search.maxUniqueTimeseries=...``), where the reason is what matters
    and the query is one of the report's own: the query is left out, and a limit it names is said again
    at the end, with what to do."""
    try:
        doc = json.loads(raw)
        text = f"{doc.get('errorType', 'error')}: {doc.get('error', raw[:200].decode(errors='replace'))}"
    except (ValueError, AttributeError):
        text = raw[:MAX_ERROR_BYTES].decode(errors="replace").strip() or "(empty answer)"
    text = _QUOTED_QUERY.sub("query=(the report's query)", text)
    if len(text) > 300:  # the reason is at the end
        text = f"{text[:100]} ... {text[-190:]}"
    limits = list(dict.fromkeys(_STORE_LIMIT.findall(text)))
    if limits:
        text += (f" [the store's limit {', '.join(limits)}: raise it on the store, or ask for less (a shorter "
                 "range, a --selector)]")  # fmt: skip
    return for_terminal(text)


_QUOTED_QUERY = re.compile(r'query="(?:[^"\\]|\\.)*"')
# VictoriaMetrics' command-line limits a refusal names (-search.maxUniqueTimeseries, -search.maxQueryDuration,
# -search.maxSamplesPerQuery, -memory.allowedBytes, ...), and Prometheus' (query.max-samples).
_STORE_LIMIT = re.compile(r"-(?:search|memory)\.[A-Za-z]+|query\.max-samples")
