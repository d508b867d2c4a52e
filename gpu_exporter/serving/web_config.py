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
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import bcrypt
import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

log = structlog.get_logger(__name__)

# The headers exporter-toolkit lets a web config set.
ALLOWED_HEADERS = frozenset(
    {"Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
     "Content-Security-Policy"}
)  # fmt: skip
_AUTH_CACHE_S = 60.0
_AUTH_CACHE_MAX = 256
_CHECK_EVERY_S = 1.0


class WebConfigError(Exception):
    pass


class _TLS(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: str
    key_file: str
    client_auth_type: Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = "NoClientCert"
    client_ca_file: str | None = None
    min_version: Literal["TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS12", "TLS13"] | None = None


class _HTTP(BaseModel):
    model_config = ConfigDict(extra="forbid")
    headers: dict[str, str] = Field(default_factory=dict)

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
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt(cls, v: dict[str, str]) -> dict[str, str]:
        for user, hashed in v.items():
            if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
                raise ValueError(f"the password of user {user!r} must be a bcrypt hash ($2b$..., 60 characters)")
        return v


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


def load_web_config(path: Path | None) -> WebConfig:
    """Parse and check the file and everything it names; raises WebConfigError saying what is wrong."""
    if path is None:
        return WebConfig()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise WebConfigError(f"cannot read web config file {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise WebConfigError(f"web config file {path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise WebConfigError(f"web config file {path} must hold a mapping")
    try:
        cfg = _File.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {msg}")
        raise WebConfigError(f"web config file {path}: " + "; ".join(problems)) from e
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
    """The current WebConfig, reloaded when the file or a certificate changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._config = load_web_config(path)  # a broken file at start is the caller's exit 2
        self._stamps = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self._auth_cache: dict[bytes, float] = {}
        self._dummy = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=4))

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
                    self._auth_cache.clear()
                    log.info("web_config_reloaded", path=str(self.path))
                except WebConfigError as e:
                    log.error("web_config_reload_failed", error=str(e), keeping="the previous configuration")
            return self._config

    def check_basic_auth(self, config: WebConfig, header: str | None) -> bool:
        """Whether an ``Authorization: Basic`` header names a user with the right password.

        bcrypt is slow on purpose, so a success is remembered for a minute under a hash of the
        credentials; an unknown user still costs a bcrypt check, so timing does not tell users apart.
        """
        user, password = _parse_basic(header)
        if user is None or password is None:
            return False
        key = hashlib.sha256(b"%s\0%s" % (user.encode(), password.encode())).digest()
        now = time.monotonic()
        with self._lock:
            expires = next((t for k, t in self._auth_cache.items() if hmac.compare_digest(k, key)), None)
        if expires is not None and expires > now:
            return True
        hashed = config.users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self._dummy) and hashed is not None
        if ok:
            with self._lock:
                if len(self._auth_cache) >= _AUTH_CACHE_MAX:
                    self._auth_cache.clear()
                self._auth_cache[key] = now + _AUTH_CACHE_S
        return ok


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
