"""The pages the daemon serves: /metrics, the probes, the alerts and a landing page.

Each page is a function of the request's headers (names lower-cased) that returns the status, the
body, its content type and extra headers; the wiring hands them to the web server, which knows
HTTP and nothing of what it serves.  Nothing here touches NVML: a scrape only copies bytes rendered
at the last poll.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping

from .. import __version__
from ..alerting.engine import Alert
from ..snapshot import HolderLabels
from .alerts_page import EVERY_HOLDER, alerts_html, alerts_json
from .exposition import CONTENT_TYPE, Exposition

Answer = tuple[int, bytes, str, Mapping[str, str]]  # as the web server takes it
Page = Callable[[Mapping[str, str]], Answer]
Readiness = Callable[[], tuple[bool, str]]
ActiveAlerts = Callable[[], list[Alert]]

_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"


def pages(exposition: Exposition, readiness: Readiness, active_alerts: ActiveAlerts = list, *, node: str = "",
          gpu_models: Callable[[], Mapping[str, str]] = dict, liveness: Readiness = lambda: (True, "ok"),
          holders: HolderLabels = EVERY_HOLDER) -> dict[str, Page]:  # fmt: skip
    def metrics(headers: Mapping[str, str]) -> Answer:
        gz = accepts_gzip(headers.get("accept-encoding", ""))
        return 200, exposition.body(gzipped=gz), CONTENT_TYPE, {"Content-Encoding": "gzip"} if gz else {}

    def ready(_: Mapping[str, str]) -> Answer:
        ok, why = readiness()
        return (200 if ok else 503), (why + "\n").encode(), _TEXT, {}

    def alive(_: Mapping[str, str]) -> Answer:
        ok, why = liveness()
        return (200 if ok else 503), (why + "\n").encode(), _TEXT, {}

    return {
        "/metrics": metrics,
        "/healthz": alive,
        "/readyz": ready,
        "/api/v1/alerts": lambda _: (200, alerts_json(active_alerts()), "application/json", {}),
        "/alerts": lambda _: (200, alerts_html(active_alerts(), node, gpu_models(), holders), _HTML, {}),
        "/": lambda _: (200, _landing_page(), _HTML, {}),
    }


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header allows gzip: named with q > 0, or ``*`` with q > 0 and gzip
    not named (RFC 9110, 12.5.3)."""
    gzip_q: float | None = None
    any_q: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if coding == "gzip":
            gzip_q = q
        elif coding == "*":
            any_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return any_q is not None and any_q > 0


def _landing_page() -> bytes:
    return (
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
        f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
        "<ul><li><a href='/metrics'>metrics</a></li><li><a href='/alerts'>alerts</a></li>"
        "<li><a href='/api/v1/alerts'>alerts (JSON)</a></li><li><a href='/healthz'>healthz</a></li>"
        "<li><a href='/readyz'>readyz</a></li></ul></body></html>\n"
    ).encode()
