"""The exporter-toolkit web config file (``--web.config.file``): TLS, mTLS, basic auth, headers, rate limit.

The same YAML that Prometheus's Go exporters read, key for key (exporter-toolkit's
``web/tls_config.go``)::

    tls_server_config:                 # see tls_context: certificates, client auth, versions, ciphers, curves
      cert_file: /etc/gpu-exporter/tls.crt
      key_file: /etc/gpu-exporter/tls.key
    http_server_config:
      http2: true                      # accepted; HTTP/2 is not served (a warning says so)
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hashes only
    rate_limit:                        # a token bucket over every request but the probes
      interval: 100ms
      burst: 20

Every key is honoured, or refused with a message that names it and says why; what is accepted but
cannot be applied is loaded with a warning (``WebConfig.warnings``), logged once per load by whoever
installs it.  Values that would break every request are refused at load: a bcrypt cost outside
4..16 (31 is bcrypt's own limit; above 16 one check takes seconds), a header value with control
characters (header injection), outside Latin-1, or outside the values exporter-toolkit allows, a
rate limit that lets no request through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from ..settings.yamlfile import YamlFileError, clip, read_mapping
from .rate_limit import RateLimit, parse_go_duration
from .tls_context import ServerTls, TlsConfigError, TlsServerConfig, build

# The headers exporter-toolkit lets a web config set, and the values it allows (None: any).
ALLOWED_HEADERS: Mapping[str, tuple[str, ...] | None] = MappingProxyType({
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None,
})  # fmt: skip
MAX_BCRYPT_COST = 16
# $2b$, two digits of cost, 22 characters of salt (the last carries 2 bits, so only 4 letters
# fit), 31 of hash: anything else bcrypt rejects, or answers with an empty reply.
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}$")


class WebConfigError(Exception):
    pass


def _bcrypt_hash(v: str) -> str:
    m = _BCRYPT.match(v)
    if m is None:
        raise ValueError("must be a bcrypt hash ($2b$, cost, 53 characters of salt and hash; 60 in all)")
    cost = int(m.group(1))
    if not 4 <= cost <= MAX_BCRYPT_COST:
        raise ValueError(
            f"bcrypt cost {cost} is outside 4..{MAX_BCRYPT_COST}: "
            + ("bcrypt cannot check it" if not 4 <= cost <= 31 else "each check would take seconds")
            + "; use 10 to 12 (htpasswd -nbB -C 10 user password)"
        )
    return v


def _header_value(v: str) -> str:
    bad = next((c for c in v if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"contains the control character {bad!r}, which would end the header and start another")
    try:
        v.encode("latin-1")
    except UnicodeEncodeError as e:
        raise ValueError(f"{v[e.start]!r} is outside Latin-1, which HTTP headers are written in") from e
    return v


BcryptHash = Annotated[str, AfterValidator(_bcrypt_hash)]
HeaderValue = Annotated[str, AfterValidator(_header_value)]


class _HTTP(BaseModel):
    model_config = ConfigDict(extra="forbid")
    headers: dict[str, HeaderValue] = Field(default_factory=dict)
    http2: bool | None = None  # None: not given

    @field_validator("headers")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - set(ALLOWED_HEADERS))
        if bad:
            raise ValueError(f"header(s) {bad} cannot be set; allowed: {sorted(ALLOWED_HEADERS)}")
        for name, value in v.items():
            allowed = ALLOWED_HEADERS[name]
            if allowed is not None and value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)} (as exporter-toolkit allows)")
        return v


class _RateLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval: Annotated[float, BeforeValidator(parse_go_duration)] = 0.0
    burst: int = Field(0, ge=0)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tls_server_config: TlsServerConfig | None = None
    http_server_config: _HTTP = Field(default_factory=_HTTP)
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)
    rate_limit: _RateLimit = Field(default_factory=_RateLimit)


@dataclass(frozen=True)
class WebConfig:
    """A loaded web config: TLS (None for plain HTTP), users, headers and the rate limit."""

    tls: ServerTls | None = None
    users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    rate_limit: RateLimit | None = None
    files: tuple[Path, ...] = ()  # everything whose change triggers a reload
    warnings: tuple[str, ...] = ()  # what is accepted but not applied, to be logged once

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    @property
    def decoy_hash(self) -> bytes:
        """What an unknown user's password is checked against: the costliest configured hash, so
        that an unknown user takes as long as a known one with a wrong password."""
        return max(self.users.values(), key=lambda h: int(h[4:6]))


def load_web_config(path: Path | None) -> WebConfig:
    """Parse and check the file and everything it names; raises WebConfigError saying what is wrong."""
    if path is None:
        return WebConfig()
    try:
        raw = read_mapping(path, "web config file") or {}
    except YamlFileError as e:
        raise WebConfigError(str(e)) from e
    try:
        cfg = _File.model_validate(raw)
    except ValidationError as e:
        raise WebConfigError(clip(f"web config file {path}: " + "; ".join(_problems(e)))) from None
    files = [path]
    warnings: list[str] = []
    tls = None
    if cfg.tls_server_config is not None:
        try:
            tls, tls_files, warnings = build(cfg.tls_server_config, path.parent)
        except TlsConfigError as e:
            raise WebConfigError(f"web config file {path}: {e}") from None
        files += tls_files
    if cfg.http_server_config.http2:
        warnings.append("http_server_config.http2: HTTP/2 is not served here; clients use HTTP/1.1 "
                        "(TLS offers only http/1.1 by ALPN), which every Prometheus speaks")  # fmt: skip
    limit = None
    if cfg.rate_limit.interval > 0:
        if cfg.rate_limit.burst < 1:
            raise WebConfigError(f"web config file {path}: rate_limit.burst 0 with an interval lets no request "
                                 "through (a token bucket of size 0); give burst 1 or more")  # fmt: skip
        limit = RateLimit(cfg.rate_limit.interval, cfg.rate_limit.burst)
    users = {u: h.encode() for u, h in cfg.basic_auth_users.items()}
    return WebConfig(tls, MappingProxyType(users), MappingProxyType(dict(cfg.http_server_config.headers)), limit,
                     tuple(files), tuple(f"web config file {path}: {w}" for w in warnings))  # fmt: skip


def _problems(e: ValidationError) -> list[str]:
    """One line per problem, naming the key; never the value given (it may be a key or a password)."""
    problems = []
    for err in e.errors(include_input=False, include_url=False):
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        problems.append(f"{key}: {msg}")
    return problems
