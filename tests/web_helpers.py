"""Helpers for the HTTP server tests: an in-process server, clients, TLS material, basic auth."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bcrypt
import trustme
import yaml
from prometheus_client import CollectorRegistry, Gauge

from gpu_exporter.serving.exposition import Exposition
from gpu_exporter.serving.pages import pages
from gpu_exporter.web.server import HttpServer
from gpu_exporter.web.watcher import WebConfigWatcher


def hashed(password: str, rounds: int = 4) -> str:
    """A new bcrypt hash, with a new salt each call (as htpasswd makes them)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


_BCRYPT_64 = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def fixed_hash(password: str, rounds: int = 4) -> str:
    """The same bcrypt hash in every process, for values that become part of a test's id: a random
    salt made ``pytest -n 2`` collect different tests in each worker, and refuse to run.  The salt's
    22nd character carries 2 bits only, so it is one of the four whose other 4 bits are 0."""
    digest = hashlib.sha256(f"{password}/{rounds}".encode()).digest()
    salt = "".join(_BCRYPT_64[b % 64] for b in digest[:21]) + ".Oeu"[digest[21] % 4]
    return bcrypt.hashpw(password.encode(), f"$2b${rounds:02d}${salt}".encode()).decode()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@contextmanager
def server(tmp_path: Path, web: Mapping[str, Any] | None = None, *, series: int = 1,
           watcher: Callable[[Path | None], WebConfigWatcher] = WebConfigWatcher,
           **kw: Any) -> Iterator[HttpServer]:  # fmt: skip
    """The real HTTP server in this process, serving a registry of ``series`` samples."""
    registry = CollectorRegistry()
    g = Gauge("gpu_up", "help", ["gpu", "uuid"], registry=registry)
    for i in range(series):
        g.labels(str(i), f"GPU-{i:08d}-0000-0000-0000-000000000000").set(1)
    expo = Exposition(registry)
    expo.render()
    path = None
    if web is not None:
        path = tmp_path / "web.yml"
        path.write_text(yaml.safe_dump(web))
    srv = HttpServer("127.0.0.1:0", pages(expo, lambda: (True, "ready")), web=watcher(path), **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None, method: str = "GET",
        timeout: float = 10, source: str | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One request; ``source``: the client's own address (any of 127.0.0.0/8 on Linux), to stand
    for another host."""
    conn: http.client.HTTPConnection
    bind = (source, 0) if source else None
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout, source_address=bind)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=bind)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def raw(port: int, data: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def tls_files(tmp_path: Path, ca: trustme.CA, name: str = "server", *,
              key_type: trustme.KeyType = trustme.KeyType.ECDSA) -> tuple[Path, Path]:  # fmt: skip
    cert = ca.issue_cert("127.0.0.1", "localhost", key_type=key_type)
    crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(key))
    cert.cert_chain_pems[0].write_to_path(str(crt))
    return crt, key


def client_context(ca: trustme.CA, client_cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client_cert is not None:
        client_cert.configure_cert(ctx)
    return ctx


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def proc_status(pid: int) -> dict[str, int]:
    """RSS (KiB), threads and open fds of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}  # fmt: skip


def client_cert_pem(ca: trustme.CA, *identities: str, uris: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A client certificate (PEM) signed by ``ca``, with these SANs (DNS, IP, e-mail, and URIs, which
    trustme cannot write), and its key (PEM)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    names: list[x509.GeneralName] = []
    for identity in identities:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(identity)))
        except ValueError:
            names.append(x509.RFC822Name(identity) if "@" in identity else x509.DNSName(identity))
    names += [x509.UniformResourceIdentifier(u) for u in uris]
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def tls_client(port: int, context: ssl.SSLContext, request: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
               timeout: float = 10) -> tuple[tuple[str, str, int] | None, bytes]:  # fmt: skip
    """A TLS connection: the cipher it agreed and what the server answered to ``request`` (b"" if it
    closed the connection first)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as s,
    ):
        cipher = s.cipher()
        answer = b""
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except (ssl.SSLError, ConnectionError, TimeoutError):
            pass
        return cipher, answer
