"""The /metrics body, rendered at most once per poll and served as-is to every scrape.

Rendering on every scrape would make the exporter's cost grow with the scrape rate (and with
the number of Prometheus replicas); here a scrape is, but for the first after a poll, a lookup
and a socket write.
"""

from __future__ import annotations

import gzip
import math
import threading

from prometheus_client import CollectorRegistry, disable_created_metrics

from ..untrusted import LABEL_MAX, label, text

# render_text writes the classic text format; say so, whatever newer version the library advertises.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# A *_created series per histogram and counter doubles the series count for no use on dashboards.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Exposition:
    """The rendered page, at most once per poll.

    A poll only marks the page stale; the first scrape after it renders it (a few milliseconds,
    no NVML), and every later scrape until the next poll gets the same bytes. Polls that no scrape
    reads cost no rendering at all: with a 5 s poll and a 15 s scrape, two of three.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._plain: bytes | None = None  # None: stale, rendered by the next scrape
        self._gzipped: bytes | None = None  # compressed from _plain, None until a gzip scrape asks

    def invalidate(self) -> None:
        with self._lock:
            self._plain = None

    def render(self) -> None:
        body = render_text(self._registry)
        with self._lock:
            self._plain = body
            self._gzipped = None

    def body(self, gzipped: bool = False) -> bytes:
        with self._lock:
            if self._plain is None:
                self._plain = render_text(self._registry)
                self._gzipped = None
            if not gzipped:
                return self._plain
            if self._gzipped is None:
                # Compressed on the first gzip scrape after a render, then shared by the rest.
                self._gzipped = gzip.compress(self._plain, compresslevel=6, mtime=0)
            return self._gzipped


# Every type prometheus_client's Metric accepts (metrics_core.METRIC_TYPES; test_exposition checks
# that none is missing), as the classic text format names it.
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
          "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}  # fmt: skip


_SUFFIXES = {"counter": "_total", "info": "_info"}


def _value(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))  # "1", not "1.0": shorter, and what Go exporters write
    return repr(v)


def _escape(v: str) -> str:
    if len(v) > LABEL_MAX:  # a 100 KB pod name would make every scrape 100 KB longer per series
        v = label(v)
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


def render_text(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of everything in ``registry``.

    The same output as prometheus_client's generate_latest, written in one pass with less
    per-sample work: rendering is most of the daemon's CPU once NVML has been read.
    """
    out: list[str] = []
    append = out.append
    for metric in registry.collect():
        name = metric.name + _SUFFIXES.get(metric.type, "")  # the name its samples have
        help_text = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        append(f"# HELP {name} {help_text}\n# TYPE {name} {_TYPES[metric.type]}\n")
        for s in metric.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
                line = f"{s.name}{{{labels}}} {_value(s.value)}"
            else:
                line = f"{s.name} {_value(s.value)}"
            if s.timestamp is not None:
                line += f" {round(float(s.timestamp) * 1000)}"  # nearest ms: 0.336 s * 1000 is 335.99999...
            append(line + "\n")
    page = "".join(out)
    try:
        return page.encode()
    except UnicodeEncodeError:
        # A value from outside that was not decoded leniently where it was read: one bad value
        # must not cost every scrape (the values themselves are made safe in gpu_exporter.untrusted).
        return text(page).encode()
