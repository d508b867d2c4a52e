"""Basic auth: bcrypt checks, the answers remembered, and the bounded queue of checks.

- bcrypt is slow on purpose, so the answer is remembered (as exporter-toolkit does) under a hash of
  the user, the stored hash and the password: 256 successes and 1,024 failures, least recently
  used dropped first.  A new hash in the file forgets what was learnt about the old one; a reload
  that leaves a user's entry as it was keeps it.
- An unknown user costs a check against the costliest configured hash, so timing does not tell
  users apart.
- bcrypt reads at most 72 bytes of a password, and bcrypt 5 refuses more: a longer password is
  wrong at once, without a check or a place in the queue (exporter-toolkit's Go bcrypt refuses it too).
- Checks run in ``workers`` threads with at most ``queue`` waiting, and at most ``per_host`` of
  them (running or waiting) from one client host (``host_key``: an IPv4 address, an IPv6 /64);
  more get None (the server answers 429) at once.  After a failed check the worker rests as long
  as the check took, so wrong passwords get at most half a core per worker.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import ipaddress
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import structlog

from .config import WebConfig
from .pacing import Pacer

log = structlog.get_logger(__name__)

_REMEMBER_GOOD = 256  # credentials that passed, most recently used kept
_REMEMBER_BAD = 1024  # and that failed: a scraper retrying an old password costs no bcrypt
BCRYPT_MAX_PASSWORD = 72  # bytes


class Passwords:
    """Whether an ``Authorization: Basic`` header names a user of a WebConfig with the right password."""

    def __init__(self, pacer: Pacer | None = None) -> None:
        self._pacer = pacer or Pacer(60.0)
        self._lock = threading.Lock()
        # sha256(user, stored hash, password) -> None: keyed by the stored hash too, so a changed
        # password in the file forgets what was learnt about the old one.
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()

    def remembered(self, config: WebConfig, header: str | None) -> bool | None:
        """The answer for credentials already checked (or unparseable), without bcrypt; None if unknown."""
        user, password = parse_basic(header)
        if user is None or password is None or len(password.encode()) > BCRYPT_MAX_PASSWORD:
            return False
        key = _key(config, user, password)
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            if key in self._bad:
                return False
        return None

    def check(self, config: WebConfig, header: str | None) -> bool:
        """The answer, from memory or from bcrypt (slow: call it from a worker thread)."""
        known = self.remembered(config, header)
        if known is not None:
            return known
        user, password = parse_basic(header)
        assert user is not None and password is not None
        hashed = config.users.get(user)
        try:
            ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else config.decoy_hash)
        except ValueError:  # a hash bcrypt cannot read; refused at load, so only if bcrypt changes its mind
            held = self._pacer.ready("basic_auth_hash_unreadable")
            if held is not None:  # a configured user's name, never one a client made up
                log.error("basic_auth_hash_unreadable", user=user if hashed is not None else None, held_back=held)
            ok = False
        ok = ok and hashed is not None
        key = _key(config, user, password)
        with self._lock:
            table, size = (self._good, _REMEMBER_GOOD) if ok else (self._bad, _REMEMBER_BAD)
            table[key] = None
            if len(table) > size:
                table.popitem(last=False)
        return ok


class PasswordGate:
    """The checks that bcrypt has to make, bounded in threads, in waiting and per client host."""

    def __init__(self, passwords: Passwords, *, workers: int = 1, queue: int = 4, per_host: int = 1) -> None:
        self.passwords = passwords
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="basic-auth")
        self._pending = 0
        self._limit = workers + queue
        self._per_host = per_host
        self._by_host: dict[str, int] = {}

    async def authenticate(self, config: WebConfig, header: str | None, host: str) -> bool | None:
        """Whether the credentials are right; None when too many checks are already waiting, or
        this host already has its share of them.  Runs on the server's loop (one thread)."""
        known = self.passwords.remembered(config, header)
        if known is not None:
            return known
        held = self._by_host.get(host, 0)
        # Without the share per host, one host's flood would take every place, and a scraper whose
        # password is not remembered yet would get nothing but 429 while it lasts.
        if self._pending >= self._limit or held >= self._per_host:
            return None
        self._pending += 1
        self._by_host[host] = held + 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._check_paced, config, header)
        finally:
            self._pending -= 1
            left = self._by_host.pop(host) - 1
            if left:
                self._by_host[host] = left

    def _check_paced(self, config: WebConfig, header: str | None) -> bool:
        """A bcrypt check; a failed one then rests as long as it took, so that a flood of wrong
        passwords gets at most half a core, whatever the cost of the hashes."""
        t0 = time.monotonic()
        ok = self.passwords.check(config, header)
        if not ok:
            time.sleep(time.monotonic() - t0)
        return ok

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def host_key(address: str) -> str:
    """What counts as one client host: an IPv4 address, or an IPv6 /64 (a host is commonly given a
    whole /64 and can pick any address in it).  IPv4-mapped IPv6 addresses count as IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _key(config: WebConfig, user: str, password: str) -> bytes:
    stored = config.users.get(user, b"")
    return hashlib.sha256(b"\0".join((user.encode(), stored, password.encode()))).digest()


def parse_basic(header: str | None) -> tuple[str | None, str | None]:
    """User and password of an ``Authorization: Basic`` header; (None, None) if it is not one."""
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
