"""The exporter-toolkit web config file (``--web.config.file``): TLS, mTLS, basic auth, headers.

The same YAML that Prometheus's Go exporters read::

    tls_server_config:
      cert_file: /etc/gpu-exporter/tls.crt
      key_file: /etc/gpu-exporter/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
      client_ca_file: /etc/gpu-exporter/ca.crt
      min_version: TLS12                             # or TLS13; TLS 1.2 is the floor
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2b$12$...                         # bcrypt hashes only

The file and the certificates it names are re-read when they change, without a restart: a
``WebConfigWatcher`` checks their modification times at most once a second, and a changed file
that fails to load is logged and ignored, keeping the last good configuration.

Values that would break every request are refused at load: a bcrypt cost outside 4..16 (31 is
bcrypt's own limit; above 16 one check takes seconds), a header value with control characters
(header injection) or outside Latin-1, a TLS maximum version below the minimum.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import bcrypt
import structlog
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..yamlfile import YamlFileError, clip, read_mapping

log = structlog.get_logger(__name__)

# The headers exporter-toolkit lets a web config set.
ALLOWED_HEADERS = frozenset(
    {"Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
     "Content-Security-Policy"}
)  # fmt: skip
_REMEMBER_GOOD = 256  # credentials that passed, most recently used kept
_REMEMBER_BAD = 1024  # and that failed: a scraper retrying an old password costs no bcrypt
_CHECK_EVERY_S = 1.0
MAX_BCRYPT_COST = 16
# $2b$, two digits of cost, 22 characters of salt (the last carries 2 bits, so only 4 letters
# fit), 31 of hash: anything else bcrypt rejects, or answers with an empty reply.
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}$")
_TLS_ORDER = {"TLS12": 12, "TLS13": 13}


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


class _TLS(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: str
    key_file: str
    client_auth_type: Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = "NoClientCert"
    client_ca_file: str | None = None
    min_version: Literal["TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS12", "TLS13"] | None = None

    @model_validator(mode="after")
    def _versions(self) -> _TLS:
        if self.max_version is not None and _TLS_ORDER[self.max_version] < _TLS_ORDER[self.min_version]:
            raise ValueError(
                f"max_version {self.max_version} is below min_version {self.min_version}: no handshake could succeed"
            )
        return self


class _HTTP(BaseModel):
    model_config = ConfigDict(extra="forbid")
    headers: dict[str, HeaderValue] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - ALLOWED_HEADERS)
        if bad:
            raise ValueError(f"header(s) {bad} cannot be set; allowed: {sorted(ALLOWED_HEADERS)}")
        return v


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tls_server_config: _TLS | None = None
    http_server_config: _HTTP = Field(default_factory=_HTTP)
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)


@dataclass(frozen=True)
class WebConfig:
    """A loaded web config: an SSL context (or None for plain HTTP), users and headers."""

    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    files: tuple[Path, ...] = ()  # everything whose change triggers a reload

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
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {msg}")
        raise WebConfigError(clip(f"web config file {path}: " + "; ".join(problems))) from e
    base = path.parent
    files = [path]
    context = None
    if cfg.tls_server_config is not None:
        try:
            context, tls_files = _ssl_context(cfg.tls_server_config, base)
        except WebConfigError as e:
            raise WebConfigError(f"web config file {path}: {e}") from e
        files += tls_files
    users = {u: h.encode() for u, h in cfg.basic_auth_users.items()}
    return WebConfig(context, MappingProxyType(users), MappingProxyType(dict(cfg.http_server_config.headers)),
                     tuple(files))  # fmt: skip


def _resolve(base: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else base / p  # relative to the web config file, as exporter-toolkit does


def _ssl_context(t: _TLS, base: Path) -> tuple[ssl.SSLContext, list[Path]]:
    cert, key = _resolve(base, t.cert_file), _resolve(base, t.key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if t.min_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    if t.max_version is not None:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_3 if t.max_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise WebConfigError(f"cannot load TLS certificate {cert} with key {key}: {e}") from e
    files = [cert, key]
    if t.client_auth_type != "NoClientCert":
        if not t.client_ca_file:
            raise WebConfigError(f"client_auth_type {t.client_auth_type} needs client_ca_file")
        ca = _resolve(base, t.client_ca_file)
        try:
            ctx.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"cannot load client CA file {ca}: {e}") from e
        ctx.verify_mode = ssl.CERT_REQUIRED if t.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        files.append(ca)
    return ctx, files


class WebConfigWatcher:
    """The current WebConfig, reloaded when the file or a certificate changes, or on request."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._config = load_web_config(path)  # a broken file at start is the caller's exit 2
        self._stamps = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        # sha256(user, stored hash, password) -> None: keyed by the stored hash too, so a changed
        # password in the file forgets what was learnt about the old one.
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        out = []
        for f in self._config.files:
            try:
                st = os.stat(f)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((-1, -1))
        return tuple(out)

    def current(self) -> WebConfig:
        now = time.monotonic()
        if self.path is None or now - self._checked < _CHECK_EVERY_S:
            return self._config
        with self._lock:
            if now - self._checked < _CHECK_EVERY_S:
                return self._config
            self._checked = now
            stamps = self._stat()
            if stamps != self._stamps:
                self._stamps = stamps
                try:
                    self._config = load_web_config(self.path)
                    self._stamps = self._stat()
                    log.info("web_config_reloaded", path=str(self.path))
                except WebConfigError as e:
                    log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
            return self._config

    def install(self, path: Path | None, config: WebConfig) -> None:
        """Use ``config``, loaded from ``path``, from now on (a reload on SIGHUP)."""
        with self._lock:
            self.path = path
            self._config = config
            self._stamps = self._stat()
            self._checked = time.monotonic()

    def remembered(self, config: WebConfig, header: str | None) -> bool | None:
        """The answer for credentials already checked (or unparseable), without bcrypt; None if unknown."""
        user, password = _parse_basic(header)
        if user is None or password is None:
            return False
        key = _key(config, user, password)
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            if key in self._bad:
                return False
        return None

    def check_basic_auth(self, config: WebConfig, header: str | None) -> bool:
        """Whether an ``Authorization: Basic`` header names a user with the right password.

        bcrypt is slow on purpose, so the answer is remembered (as exporter-toolkit does) under a
        hash of the credentials; an unknown user costs a check against the costliest configured
        hash, so timing does not tell users apart.
        """
        known = self.remembered(config, header)
        if known is not None:
            return known
        user, password = _parse_basic(header)
        assert user is not None and password is not None
        hashed = config.users.get(user)
        try:
            ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else config.decoy_hash)
        except ValueError:  # a hash bcrypt cannot read; refused at load, so only if bcrypt changes its mind
            log.error("basic_auth_hash_unreadable", user=user)
            ok = False
        ok = ok and hashed is not None
        key = _key(config, user, password)
        with self._lock:
            table, size = (self._good, _REMEMBER_GOOD) if ok else (self._bad, _REMEMBER_BAD)
            table[key] = None
            if len(table) > size:
                table.popitem(last=False)
        return ok


def _key(config: WebConfig, user: str, password: str) -> bytes:
    stored = config.users.get(user, b"")
    return hashlib.sha256(b"\0".join((user.encode(), stored, password.encode()))).digest()


def _parse_basic(header: str | None) -> tuple[str | None, str | None]:
    import base64
    import binascii

    if not header:
        return None, None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None, None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)


def describe(config: WebConfig) -> dict[str, Any]:
    return {"tls": config.ssl_context is not None, "basic_auth_users": len(config.users)}
