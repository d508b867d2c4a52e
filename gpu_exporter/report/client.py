"""A client for the Prometheus HTTP query API, as Prometheus, Thanos Query, Mimir and VictoriaMetrics
serve it: instant and range queries by POST, with the options Prometheus tooling has (bearer token
file, basic auth, CA file, timeout)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Labels = dict[str, str]


class QueryError(Exception):
    """The API could not be reached or refused a query; the message says which and why."""


@dataclass(frozen=True)
class ClientOptions:
    url: str
    bearer_token_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    timeout: float = 120.0


def _secret(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise QueryError(f"cannot read the {what} file {path}: {e.strerror or e}") from e


class PromClient:
    def __init__(self, opts: ClientOptions) -> None:
        parsed = urllib.parse.urlsplit(opts.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise QueryError(f"--prometheus.url {opts.url!r} must be an http:// or https:// URL")
        self.base = opts.url.rstrip("/")
        self.timeout = opts.timeout
        self.headers = {"Accept": "application/json", "User-Agent": "gpu-exporter-report"}
        if opts.bearer_token_file is not None:
            if opts.username is not None:
                raise QueryError("use a bearer token or basic auth, not both")
            self.headers["Authorization"] = "Bearer " + _secret(opts.bearer_token_file, "bearer token")
        elif opts.username is not None:
            password = _secret(opts.password_file, "password") if opts.password_file else ""
            token = base64.b64encode(f"{opts.username}:{password}".encode()).decode()
            self.headers["Authorization"] = "Basic " + token
        self.context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            try:
                self.context = ssl.create_default_context(cafile=str(opts.ca_file) if opts.ca_file else None)
            except (OSError, ssl.SSLError) as e:
                raise QueryError(f"cannot load the CA file {opts.ca_file}: {e}") from e
            if opts.insecure_skip_verify:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def _post(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base}/api/v1/{path}"
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(url, data=body, method="POST", headers={
            **self.headers, "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = _error_text(e.read())
            if e.code in (401, 403):
                raise QueryError(f"{url}: {e.code} {e.reason}: check the credentials ({detail})") from e
            raise QueryError(f"{url}: {e.code} {e.reason}: {detail}") from e
        except urllib.error.URLError as e:
            raise QueryError(f"cannot reach {url}: {e.reason}") from e
        except TimeoutError as e:
            raise QueryError(f"{url}: no answer within {self.timeout:g} s (raise --prometheus.timeout)") from e
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise QueryError(f"{url} did not answer with JSON: is it a Prometheus query API?") from e
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise QueryError(f"{url}: {_error_text(raw)}")
        return doc["data"]

    def instant(self, expr: str, at: float) -> list[tuple[Labels, float]]:
        data = self._post("query", {"query": expr, "time": f"{at:.3f}"})
        if data.get("resultType") != "vector":
            raise QueryError(f"expected a vector from {expr!r}, got {data.get('resultType')}")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def range(self, expr: str, start: float, end: float, step: float) -> list[tuple[Labels, list[tuple[float, float]]]]:
        data = self._post("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                          "step": f"{step:g}"})  # fmt: skip
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]


def _error_text(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', 'error')}: {doc.get('error', raw[:200].decode(errors='replace'))}"
    except ValueError:
        return raw[:200].decode(errors="replace").strip() or "(empty answer)"
