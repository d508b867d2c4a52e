"""The /metrics body, rendered once per poll and served as-is to every scrape.

Rendering on every scrape would make the exporter's cost grow with the scrape rate (and with
the number of Prometheus replicas); here a scrape is a dictionary lookup and a socket write.
"""

from __future__ import annotations

import gzip
import threading

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

# generate_latest writes the classic text format; say so, whatever newer version the library advertises.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# A *_created series per histogram and counter doubles the series count for no use on dashboards.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Exposition:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._plain = b""
        self._gzipped: bytes | None = None

    def render(self) -> None:
        body = generate_latest(self._registry)
        with self._lock:
            self._plain = body
            self._gzipped = None

    def body(self, gzipped: bool = False) -> bytes:
        with self._lock:
            if not gzipped:
                return self._plain
            if self._gzipped is None:
                # Compressed on the first gzip scrape after a render, then shared by the rest.
                self._gzipped = gzip.compress(self._plain, compresslevel=6, mtime=0)
            return self._gzipped
