"""``tls_server_config``: every key exporter-toolkit takes, and the ``ssl.SSLContext`` it becomes.

What each key does here, and why where it differs from Go (docs/security.md has the table):

- ``cert_file``/``key_file``/``client_ca_file`` (relative to the web config file) or ``cert``/``key``/
  ``client_ca`` inline.  Inline PEM is handed to OpenSSL through an anonymous in-memory file
  (``memfd_create``): the private key never touches a disk, and it is never logged or quoted in an
  error.  Where both forms are given, the file is used, as exporter-toolkit does, with a warning.
- ``client_auth_type``: ``NoClientCert``, ``VerifyClientCertIfGiven`` and
  ``RequireAndVerifyClientCert``.  ``RequestClientCert`` and ``RequireAnyClientCert`` accept a
  certificate nobody signed; Python's ssl can only ask for certificates it verifies, so they are
  refused.  A client CA without a policy that uses it is refused, as in exporter-toolkit; a policy
  that verifies without a CA is refused too (Go would trust every public CA).
- ``client_allowed_sans``: after the handshake, a client certificate must carry one of these names
  (DNS, IP, e-mail or URI, compared exactly as Go writes them), else the connection is closed
  before anything is read.  Refused without a client certificate policy (Go would never check).
- ``min_version``/``max_version``: TLS 1.2 is the floor (RFC 8996); ``TLS10``/``TLS11`` as a
  minimum are raised to TLS 1.2 with a warning; a maximum below it is refused.
- ``cipher_suites`` (Go's names, mapped to OpenSSL's, in order) and ``prefer_server_cipher_suites``
  (the server's order, or the client's).  TLS 1.3 suites cannot be chosen, in Go as here.
- ``curve_preferences``: Python's ssl can restrict the key exchange to one curve
  (``set_ecdh_curve``), not to a list: one curve is applied; several keep OpenSSL's defaults,
  which include all four that exporter-toolkit knows, with a warning.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

from ..settings.yamlfile import read_bounded
from .ciphers import CURVES, FLOOR, TLS12_SUITES, TLS13_SUITES, VERSIONS

_SECTION = "tls_server_config"
_VERIFYING = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_UNVERIFIED = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
_TLS_VERSIONS = {2: ssl.TLSVersion.TLSv1_2, 3: ssl.TLSVersion.TLSv1_3}
# What Python's getpeercert() calls the SAN kinds that Go compares.
_SAN_KINDS = {"DNS", "email", "URI", "IP Address"}


class TlsConfigError(ValueError):
    pass


def _names(kind: str, known: Mapping[str, Any] | frozenset[str], v: list[str]) -> list[str]:
    unknown = [n for n in v if n not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}")
    return v


class TlsServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert: str | None = None
    key: SecretStr | None = None  # never shown in a repr or an error
    client_ca: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: str = ""
    client_ca_file: str | None = None
    client_allowed_sans: list[str] | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: list[str] | None = None
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] | None = None

    @field_validator("client_auth_type")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v in _UNVERIFIED:
            raise ValueError(
                f"{v} accepts a client certificate that no CA signed, which proves nothing; Python's ssl "
                "only asks for certificates it verifies: use RequireAndVerifyClientCert with client_ca_file"
            )
        if v not in ("", "NoClientCert", *_VERIFYING):
            raise ValueError(f"unknown client_auth_type {v!r}; known: NoClientCert, {', '.join(_VERIFYING)}")
        return v

    @field_validator("min_version", "max_version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _names("TLS version", VERSIONS, [v])[0]

    @field_validator("cipher_suites")
    @classmethod
    def _suites(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _names("cipher suite", TLS12_SUITES.keys() | TLS13_SUITES, v)  # type: ignore[arg-type]

    @field_validator("curve_preferences")
    @classmethod
    def _curves(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _names("curve", CURVES, v)

    @model_validator(mode="after")
    def _consistent(self) -> TlsServerConfig:
        if VERSIONS[self.max_version] < VERSIONS[FLOOR]:
            raise ValueError(f"max_version {self.max_version} is below TLS 1.2, the lowest version served here")
        if VERSIONS[self.max_version] < VERSIONS[self.min_version]:
            raise ValueError(
                f"max_version {self.max_version} is below min_version {self.min_version}: no handshake could succeed"
            )
        verifies = self.client_auth_type in _VERIFYING
        has_ca = bool(self.client_ca_file or self.client_ca)
        if has_ca and not verifies:
            raise ValueError("a client CA is given, but no client_auth_type that checks client certificates "
                             "(VerifyClientCertIfGiven, RequireAndVerifyClientCert); "
                             "exporter-toolkit refuses this too")  # fmt: skip
        if verifies and not has_ca:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file or client_ca "
                             "(without one, Go would trust every public CA)")  # fmt: skip
        if self.client_allowed_sans is not None and not verifies:
            raise ValueError("client_allowed_sans needs a client_auth_type that verifies client certificates "
                             "(RequireAndVerifyClientCert); without one no certificate is asked for, "
                             "so none could be checked")  # fmt: skip
        if self.client_allowed_sans == []:
            raise ValueError("client_allowed_sans is empty: every client would be refused")
        return self

    def enabled(self) -> bool:
        """Whether TLS is on: exporter-toolkit serves plain HTTP when none of these is given."""
        return any((self.cert, self.key, self.client_ca, self.cert_file, self.key_file, self.client_ca_file,
                    self.client_auth_type))  # fmt: skip


@dataclass(frozen=True)
class ServerTls:
    """What a new TLS connection gets: the context, and the client certificate names allowed."""

    context: ssl.SSLContext
    allowed_sans: frozenset[str] | None = None  # None: any verified certificate (or none, if optional)

    def admits(self, peercert: Mapping[str, Any] | None) -> bool:
        return self.allowed_sans is None or not self.allowed_sans.isdisjoint(certificate_names(peercert))


def certificate_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """A verified certificate's DNS, e-mail, IP and URI SANs, written as Go writes them."""
    names = set()
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind not in _SAN_KINDS:
            continue
        if kind == "IP Address":
            # Python writes IPv6 in full and upper case (2001:DB8:0:0:0:0:0:1); Go compresses.
            with contextlib.suppress(ValueError):
                value = ipaddress.ip_address(value.strip()).compressed
        names.add(value)
    return names


def build(t: TlsServerConfig, base: Path) -> tuple[ServerTls | None, list[Path], list[str]]:
    """The TLS settings, the files whose change reloads them, and warnings; TlsConfigError names the key."""
    warnings: list[str] = []
    if not t.enabled():
        warnings.append(f"{_SECTION} names no certificate: served over plain HTTP, as exporter-toolkit does")
        return None, [], warnings
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_alpn_protocols(["http/1.1"])  # HTTP/2 is not served (http_server_config.http2)
    floor = max(VERSIONS[t.min_version], VERSIONS[FLOOR])
    if VERSIONS[t.min_version] < floor:
        warnings.append(f"{_SECTION}.min_version {t.min_version} is raised to TLS12: TLS 1.0 and 1.1 are not served")
    floor = _ciphers(ctx, t, floor, warnings)
    ctx.minimum_version = _TLS_VERSIONS[floor]
    ctx.maximum_version = _TLS_VERSIONS[VERSIONS[t.max_version]]
    _curves(ctx, t, warnings)
    files = _certificate(ctx, t, base, warnings)
    if t.client_auth_type in _VERIFYING:
        files += _client_ca(ctx, t, base, warnings)
        ctx.verify_mode = _VERIFYING[t.client_auth_type]
    sans = frozenset(t.client_allowed_sans) if t.client_allowed_sans is not None else None
    return ServerTls(ctx, sans), files, warnings


def _ciphers(ctx: ssl.SSLContext, t: TlsServerConfig, floor: int, warnings: list[str]) -> int:
    """Apply cipher_suites and prefer_server_cipher_suites; returns the lowest TLS version left."""
    if t.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if not t.cipher_suites:
        return floor
    wanted = [n for n in t.cipher_suites if n in TLS12_SUITES]
    if not wanted:
        if VERSIONS[t.max_version] < VERSIONS["TLS13"]:
            raise TlsConfigError(f"{_SECTION}.cipher_suites lists only TLS 1.3 suites, which leave TLS 1.2 no "
                                 "cipher, and max_version is TLS12: no handshake could succeed")  # fmt: skip
        if floor < VERSIONS["TLS13"]:
            warnings.append(f"{_SECTION}.cipher_suites lists only TLS 1.3 suites, which cannot be chosen: "
                            "TLS 1.2 has no cipher left, so only TLS 1.3 is served, as in Go")  # fmt: skip
        return VERSIONS["TLS13"]
    try:
        ctx.set_ciphers(":".join(TLS12_SUITES[n] for n in wanted))
    except ssl.SSLError as e:
        raise TlsConfigError(f"{_SECTION}.cipher_suites: none of {', '.join(wanted)} is available in "
                             f"{ssl.OPENSSL_VERSION}") from e  # fmt: skip
    offered = {c["name"] for c in ctx.get_ciphers()}
    missing = [n for n in wanted if TLS12_SUITES[n] not in offered]
    if missing:
        warnings.append(f"{_SECTION}.cipher_suites: {', '.join(missing)} not available in {ssl.OPENSSL_VERSION}; "
                        "the others are used")  # fmt: skip
    return floor


def _curves(ctx: ssl.SSLContext, t: TlsServerConfig, warnings: list[str]) -> None:
    if not t.curve_preferences:
        return
    if len(t.curve_preferences) == 1:
        ctx.set_ecdh_curve(CURVES[t.curve_preferences[0]])
        return
    warnings.append(f"{_SECTION}.curve_preferences lists {len(t.curve_preferences)} curves; Python's ssl can "
                    "restrict the key exchange to one curve only, so OpenSSL's default curves are kept (they "
                    "include every curve listed, in OpenSSL's order): list one curve to restrict it")  # fmt: skip


def _resolve(base: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else base / p  # relative to the web config file, as exporter-toolkit does


def _both(t: TlsServerConfig, inline: str, file: str, warnings: list[str]) -> None:
    if getattr(t, inline) and getattr(t, file):
        warnings.append(f"{_SECTION}: both {inline} and {file} are given; {file} is used, as exporter-toolkit does")


def _certificate(ctx: ssl.SSLContext, t: TlsServerConfig, base: Path, warnings: list[str]) -> list[Path]:
    _both(t, "cert", "cert_file", warnings)
    _both(t, "key", "key_file", warnings)
    if not (t.cert_file or t.cert):
        raise TlsConfigError(f"{_SECTION}: give cert_file (or cert, inline)")
    if not (t.key_file or t.key):
        raise TlsConfigError(f"{_SECTION}: give key_file (or key, inline)")
    cert = _resolve(base, t.cert_file) if t.cert_file else None
    key = _resolve(base, t.key_file) if t.key_file else None
    what_cert = f"TLS certificate {cert}" if cert else "the inline TLS certificate (cert)"
    what_key = f"key {key}" if key else "the inline key (key)"
    try:
        with _pem(cert, t.cert) as cert_path, _pem(key, t.key.get_secret_value() if t.key else None) as key_path:
            ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        # Never the key's text: OpenSSL's reason, and which file or key it was.
        raise TlsConfigError(f"cannot load {what_cert} with {what_key}: {_reason(e)}") from None
    return [p for p in (cert, key) if p is not None]


def _client_ca(ctx: ssl.SSLContext, t: TlsServerConfig, base: Path, warnings: list[str]) -> list[Path]:
    _both(t, "client_ca", "client_ca_file", warnings)
    if t.client_ca_file:
        ca = _resolve(base, t.client_ca_file)
        try:
            # Read here, bounded and only as a regular file (a FIFO in its place would hang OpenSSL).
            ctx.load_verify_locations(cadata=read_bounded(ca).decode("ascii"))
        except (OSError, ssl.SSLError, ValueError) as e:  # ValueError: not PEM text
            raise TlsConfigError(f"cannot load client CA file {ca}: {_reason(e)}") from None
        return [ca]
    try:
        ctx.load_verify_locations(cadata=t.client_ca)
    except (ssl.SSLError, ValueError, TypeError) as e:  # TypeError: text that is not ASCII
        raise TlsConfigError(f"cannot load the inline client CA (client_ca): {_reason(e)}") from None
    return []


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


@contextlib.contextmanager
def _pem(path: Path | None, inline: str | None) -> Iterator[str]:
    """A path OpenSSL can read: an anonymous in-memory file holding the file's bytes (read here, bounded
    and only if it is a regular file: a named pipe put in its place would hang OpenSSL's own read) or
    the inline text."""
    if path is not None:
        data = read_bounded(path)
    else:
        assert inline is not None
        data = inline.encode()
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("gpu-exporter-pem", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    # No memfd (not Linux): a file only this user can read, in a directory removed at once.
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-") as tmp:
        name = os.path.join(tmp, "pem")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield name


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
