"""Hostile clients against the real server, with real sockets: none of them may lock a scraper out.

Each test holds an attack (idle sockets, keep-alive sockets, pipelined requests nobody reads,
handshake-only TLS connections, a flood of wrong passwords) and checks that a fresh scraper and
the kubelet's probes are still served while it lasts.  How fast this machine answers decides
nothing: where a server timeout (idle, read, handshake, write) could end the attack and let the
scraper in by itself, the server is given ``NEVER_S`` for it (``HOLDS``), so that only the defence
under test can; the scraper's answer must then come within ``LATE_S`` (``served``), and where it
is cheap to see, the attack is shown to be still in place after it.
"""

from __future__ import annotations

import http.client
import resource
import secrets
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bcrypt
import pytest
import trustme
import yaml

from gpu_exporter.web import auth
from gpu_exporter.web.auth import Passwords, host_key
from gpu_exporter.web.config import WebConfig, load_web_config
from gpu_exporter.web.server import HttpServer
from tests.exporter_helpers import wait_for
from tests.timing import LATE_S, NEVER_S
from tests.web_helpers import basic, client_context, get, hashed, open_fds, proc_status, server, tls_files

pytestmark = pytest.mark.integration

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


# The server's own timeouts, each longer than any of these tests holds an attack: none of them can
# end an attack and let a starved scraper in; only the defence under test (a place made by closing
# an older connection, a slot freed before a slow client reads, a stalled handshake preempted) can.
HOLDS: dict[str, Any] = {"read_timeout": NEVER_S, "idle_timeout": NEVER_S, "pressure_idle_timeout": NEVER_S,
                         "handshake_timeout": NEVER_S, "write_timeout": NEVER_S}  # fmt: skip


def served(port: int, path: str = "/metrics", *, after: float = 0.0, **kw: Any) -> None:
    """One request (``kw`` as for ``get``): a 200, within ``after`` (the deadline the defence
    under test has, if any) + ``LATE_S``; the client gives up then, so a scraper locked out fails."""
    within = after + LATE_S
    t0 = time.monotonic()
    status, _, _ = get(port, path, timeout=within, **kw)
    assert status == 200, status
    assert time.monotonic() - t0 < within, f"answered after {time.monotonic() - t0:.1f} s"


def timed_out(srv: HttpServer) -> dict[str, int]:
    """Connections the table closed for waiting too long (none may, with ``HOLDS``)."""
    return {why: n for why, n in srv.connections.counts.items() if why.startswith(("timed_out", "idle_under"))}


@contextmanager
def held(sockets: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield sockets
    finally:
        for s in sockets:
            s.close()


def read_response(s: socket.socket) -> bytes:
    """One response with a Content-Length: head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = int(lengths[0])
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


# -- 1. connection exhaustion ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["idle", "keep-alive"])
def test_two_thousand_held_sockets_do_not_lock_out_scrapers_or_probes(tmp_path: Path, kind: str) -> None:
    with server(tmp_path, **HOLDS) as srv, held([]) as attack:
        for _ in range(2000):
            s = socket.create_connection(("127.0.0.1", srv.port))
            attack.append(s)
            if kind == "keep-alive":
                s.sendall(HEALTHZ)
        if kind == "keep-alive":
            for s in attack:
                s.settimeout(5)
                with suppress(OSError):  # already closed to make room for newer ones
                    read_response(s)
        wait_for(lambda: len(srv.connections) == srv.connections.max_connections, what="the table full")
        for _ in range(5):
            served(srv.port)
            served(srv.port, "/healthz")
            served(srv.port, "/readyz")
        # Each was let in by closing an attacker's socket, not by a timeout: the table is still full.
        assert len(srv.connections) >= srv.connections.max_connections - 1 and not timed_out(srv)


def test_tls_keep_alive_sockets_do_not_lock_out_an_authenticated_scraper(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    web = {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)},
           "basic_auth_users": {"prom": hashed("pw")}}  # fmt: skip
    ctx = client_context(ca)
    with server(tmp_path, web, **HOLDS) as srv, held([]) as attack:
        for _ in range(1100):
            tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)), server_hostname="127.0.0.1")
            attack.append(tls)
            tls.sendall(HEALTHZ)
        for held_socket in attack:
            held_socket.settimeout(5)
            with suppress(OSError):
                read_response(held_socket)
        assert len(srv.connections) == srv.connections.max_connections
        for _ in range(5):
            served(srv.port, headers=basic("prom", "pw"), context=ctx)
            served(srv.port, "/healthz", context=ctx)
        assert len(srv.connections) >= srv.connections.max_connections - 1 and not timed_out(srv)


def test_idle_keep_alive_is_cut_short_when_the_table_fills(tmp_path: Path) -> None:
    # 30 of 40 places taken: idle connections are closed after seconds, not after the 120 s idle
    # timeout, until the table is no more than half full.
    with server(tmp_path, max_connections=40) as srv, held([]) as attack:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(HEALTHZ)
            assert read_response(s).startswith(b"HTTP/1.1 200")
            attack.append(s)

        def closed() -> int:
            readable, _, _ = select.select(attack, [], [], 0)
            return sum(1 for s in readable if s.recv(1, socket.MSG_PEEK) == b"")

        wait_for(lambda: closed() >= 10, timeout=15, what="idle connections closed under pressure")


def test_with_the_table_half_empty_keep_alive_lasts(tmp_path: Path) -> None:
    with server(tmp_path, max_connections=40) as srv, held([]) as attack:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(HEALTHZ)
            assert read_response(s).startswith(b"HTTP/1.1 200")
            attack.append(s)
        time.sleep(7)  # longer than the idle time under pressure
        for s in attack:
            s.sendall(HEALTHZ)
            assert read_response(s).startswith(b"HTTP/1.1 200")


def test_the_daemon_raises_its_soft_fd_limit_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    cmd = [sys.executable, "-m", "gpu_exporter", "--simulate", "--web.listen-address", "127.0.0.1:0",
           "--log.format", "json"]  # fmt: skip
    proc = subprocess.Popen(cmd, preexec_fn=low_limit, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if '"listening"' in line:
                break
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        row = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        soft = row.split()[3]
        assert soft == str(hard) or (soft == "unlimited" and hard == resource.RLIM_INFINITY), row
    finally:
        proc.kill()
        proc.wait()


# -- 2. slow readers --------------------------------------------------------------------------------------
def test_pipelined_requests_nobody_reads_do_not_block_scrapers(tmp_path: Path) -> None:
    # ~600 KB pages, like 64 GPUs; 45 connections each ask for 200 of them and read nothing: more
    # than the 40 request slots, so a slot held until the client reads would leave none (503).
    with server(tmp_path, series=8000, max_requests=40, **HOLDS) as srv, held([]) as attack:
        for _ in range(45):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.setblocking(False)
            with suppress(BlockingIOError):
                s.send(METRICS * 200)
            attack.append(s)
        wait_for(lambda: stalled_writers(srv) >= 40, what="an answer stalled for each request slot")
        for _ in range(20):
            served(srv.port)
            served(srv.port, "/healthz")
            assert stalled_writers(srv) >= 40  # still stalled: no timeout let the scraper in
        wait_for(lambda: stalled_writers(srv) >= 45, what="all 45 answers stalled, none cut off")


def stalled_writers(srv: HttpServer) -> int:
    """Connections waiting on a client to read what they wrote (the table's own count)."""
    return len(srv.connections._stalled)


def test_pipelining_is_bounded_per_connection(tmp_path: Path) -> None:
    with server(tmp_path) as srv, socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(HEALTHZ * 200)
        s.settimeout(NEVER_S)  # the server closes it: a hang fails here
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        answered = data.count(b"HTTP/1.1 200")
        assert 1 <= answered <= 16, answered
        last = data[data.rindex(b"HTTP/1.1 200") :]
        assert b"Connection: close" in last


def test_a_stalled_writer_is_cut_off_and_its_socket_closed(tmp_path: Path) -> None:
    with server(tmp_path, series=8000, write_timeout=1.0) as srv:
        before = open_fds()
        s = socket.create_connection(("127.0.0.1", srv.port))
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(METRICS * 20)
            wait_for(lambda: open_fds() == before + 2, timeout=5, what="the server to accept")
            # The server gives up on this client after the write timeout and frees its socket,
            # although the client still has not read anything.
            wait_for(lambda: open_fds() == before + 1, timeout=10, what="the server to close its side")
        finally:
            s.close()


def test_clients_that_do_not_read_hold_little_memory_together(tmp_path: Path) -> None:
    # Past the bound on connections waiting for their clients to read, the one waiting longest
    # goes, not at the write timeout (NEVER_S here): their unsent answers cannot pile up.
    with server(tmp_path, series=8000, max_stalled_writers=4, **HOLDS) as srv, held([]) as attack:
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(METRICS * 20)
            attack.append(s)
        wait_for(lambda: srv.connections.counts.get("stalled_writer", 0) >= 6, timeout=10,
                 what="stalled writers beyond the bound closed")  # fmt: skip
        served(srv.port)


# -- 3. TLS memory ----------------------------------------------------------------------------------------
def test_handshake_only_tls_connections_stay_under_the_pod_limit_and_memory_comes_back(
    tmp_path: Path, ca: trustme.CA
) -> None:
    crt, key = tls_files(tmp_path, ca)
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}))
    cmd = [sys.executable, "-m", "gpu_exporter", "--simulate", "--simulate.gpus", "8", "--web.config.file", str(web),
           "--web.listen-address", "127.0.0.1:0", "--log.format", "json"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ctx = client_context(ca)
    try:
        assert proc.stderr is not None
        port = 0
        for line in proc.stderr:
            if '"listening"' in line:
                port = int(yaml.safe_load(line)["port"])
                break
        threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
        for _ in range(5):
            get(port, context=ctx)
        base = proc_status(proc.pid)["rss_kib"] / 1024
        peak = base
        with held([]) as attack:
            for i in range(1000):
                with suppress(OSError):  # the server may close older ones to make room
                    attack.append(ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                                  server_hostname="127.0.0.1"))  # fmt: skip
                if i % 50 == 0:
                    peak = max(peak, proc_status(proc.pid)["rss_kib"] / 1024)
            peak = max(peak, proc_status(proc.pid)["rss_kib"] / 1024)
            assert peak < 128, f"RSS {peak:.0f} MiB with 1000 handshake-only TLS connections (base {base:.0f} MiB)"
            # The daemon's own timeouts are not ours to raise: this says only that it still serves;
            # that a place is made for a scraper while TLS sockets are held is proved above (HOLDS).
            served(port, context=ctx)
        # Once they are gone, the memory goes back to the system.
        wait_for(lambda: proc_status(proc.pid)["rss_kib"] / 1024 < base + max(8.0, 0.4 * (peak - base)),
                 timeout=20, what=f"RSS to fall back from {peak:.0f} MiB toward {base:.0f} MiB")  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


def test_stalled_handshakes_cannot_hold_every_handshake_slot(tmp_path: Path, ca: trustme.CA) -> None:
    # Two slots, five clients that start a ClientHello and go quiet: the quiet ones give their
    # slots up to a client that is waiting, after a second of silence; the handshake and read
    # timeouts (NEVER_S here) never come into it.
    crt, key = tls_files(tmp_path, ca)
    web = {"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}
    with server(tmp_path, web, max_handshakes=2, **HOLDS) as srv, held([]) as attack:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, and nothing more
            attack.append(s)
        wait_for(lambda: srv.connections.accepted == 5, what="the five quiet clients accepted")
        for _ in range(3):
            served(srv.port, "/healthz", after=srv.connections.handshake_preempt, context=client_context(ca))
        assert srv.connections.counts.get("handshake_preempted", 0) >= 1 and not timed_out(srv)


# -- 4. basic auth -----------------------------------------------------------------------------------------
def test_an_unknown_user_costs_as_much_as_a_wrong_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a guess costs is the bcrypt work it is given, whatever this machine's speed: an unknown
    # user's password is checked by bcrypt against a hash as costly as the costliest user's.
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed("right", rounds=6),
                                                         "grafana": hashed("other", rounds=4)}}))  # fmt: skip
    passwords = Passwords()
    config = load_web_config(path)
    checked: list[bytes] = []  # the hash of each bcrypt check, which still runs

    def checkpw(password: bytes, stored: bytes) -> bool:
        checked.append(stored)
        return bcrypt.checkpw(password, stored)

    monkeypatch.setattr(auth, "bcrypt", SimpleNamespace(checkpw=checkpw))

    def costs(user: str, password: str) -> list[int]:
        """The bcrypt costs (log2 rounds) that one guess took."""
        checked.clear()
        assert not passwords.check(config, basic(user, password)["Authorization"])
        return [int(h.split(b"$")[2]) for h in checked]

    assert costs("prom", "wrong") == [6] and costs("grafana", "wrong") == [4]
    assert costs("mallory", "wrong") == [6] and costs("mallory", "another") == [6]
    # A repeated guess is answered from memory, for known and unknown users alike: no bcrypt at all.
    assert costs("mallory", "wrong") == [] and costs("prom", "wrong") == []


class CountingPasswords(Passwords):
    """The real checker, with real bcrypt, that counts the checks running at once and records the
    credentials each was given and the thread it ran in.  While ``gate`` is clear each check waits
    before bcrypt, so that the places fill up deterministically."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.running = self.most = self.checks = 0
        self.headers: list[str | None] = []
        self.threads: set[str] = set()
        self._count = threading.Lock()

    def check(self, config: WebConfig, header: str | None) -> bool:
        with self._count:
            self.running += 1
            self.checks += 1
            self.most = max(self.most, self.running)
            self.headers.append(header)
            self.threads.add(threading.current_thread().name)
        try:
            if self.gate is not None:
                assert self.gate.wait(60)
            return super().check(config, header)
        finally:
            with self._count:
                self.running -= 1


@contextmanager
def counted_server(tmp_path: Path, web: dict[str, Any], gate: threading.Event | None = None,
                   **kw: Any) -> Iterator[tuple[HttpServer, CountingPasswords]]:  # fmt: skip
    passwords = CountingPasswords(gate)
    with server(tmp_path, web, passwords=passwords, **kw) as srv:
        yield srv, passwords


Answer = tuple[int, dict[str, str], bytes]


def guess(port: int, source: str, answers: list[Answer]) -> threading.Thread:
    """A client at ``source`` that tries one new random password: never remembered, always bcrypt."""

    def run() -> None:
        with suppress(OSError, http.client.HTTPException):
            answers.append(get(port, headers=basic("prom", secrets.token_urlsafe(12)), timeout=60, source=source))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def too_many(answer: Answer) -> bool:
    status, headers, body = answer
    return status == 429 and headers.get("Retry-After") == "1" and b"too many password checks at once" in body


def auth_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("basic-auth"))


def test_beyond_one_check_and_four_waiting_a_password_gets_429_at_once(tmp_path: Path) -> None:
    # Twenty hosts, one new password each, while the first check is held: one runs, four wait, and
    # fifteen are told at once to come back, with Retry-After, before any check has finished.
    gate = threading.Event()
    with counted_server(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}, gate) as (srv, watcher):
        answers: list[Answer] = []
        clients = [guess(srv.port, f"127.0.0.{10 + i}", answers) for i in range(20)]
        try:
            wait_for(lambda: len(answers) >= 15, timeout=30, what="15 answers while the checks are held")
            time.sleep(0.5)
            assert len(answers) == 15 and all(too_many(a) for a in answers), [a[:2] for a in answers]
            assert watcher.running == 1 and watcher.checks == 1 and auth_threads() <= 1
        finally:
            gate.set()
            for c in clients:
                c.join(60)
        assert len(answers) == 20 and sorted(a[0] for a in answers[15:]) == [401] * 5
        assert watcher.checks == 5 and watcher.most == 1


def test_one_host_holds_one_place_in_the_password_queue(tmp_path: Path) -> None:
    # Twenty new passwords from one host while its check is held: it keeps one place, the other
    # nineteen get 429 at once, and a scraper on another host is let in and checked, not refused.
    gate = threading.Event()
    with counted_server(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}, gate) as (srv, watcher):
        answers: list[Answer] = []
        clients = [guess(srv.port, "127.0.0.1", answers) for _ in range(20)]
        scraper: list[Answer] = []
        t = threading.Thread(target=lambda: scraper.append(get(srv.port, headers=basic("prom", "pw"), timeout=60,
                                                               source="127.0.0.2")), daemon=True)  # fmt: skip
        try:
            wait_for(lambda: len(answers) >= 19, timeout=30, what="19 answers while the check is held")
            t.start()
            time.sleep(0.5)
            assert all(too_many(a) for a in answers) and len(answers) == 19, [a[:2] for a in answers]
            assert scraper == [] and watcher.checks == 1  # the scraper waits for its turn
        finally:
            gate.set()
            if t.is_alive():
                t.join(60)
            for c in clients:
                c.join(60)
        assert [a[0] for a in scraper] == [200] and watcher.checks == 2 and watcher.most == 1


@contextmanager
def password_flood(port: int, source: str = "127.0.0.1", clients: int = 50) -> Iterator[list[Answer]]:
    """``clients`` connections from one host, each sending new random passwords as fast as it is
    answered: every one costs a bcrypt check, none is remembered.  Yields their answers."""
    stop = threading.Event()
    answers: list[Answer] = []
    seen_threads = [0]

    def flood() -> None:
        while not stop.is_set():
            with suppress(OSError, http.client.HTTPException):
                answers.append(get(port, headers=basic("prom", secrets.token_urlsafe(12)), timeout=10, source=source))
            seen_threads[0] = max(seen_threads[0], auth_threads())

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: any(too_many(a) for a in answers), what="the flood to overflow the checks")
        yield answers
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert seen_threads[0] <= 1, f"{seen_threads[0]} bcrypt threads"


def still_flooding(flood: list[Answer]) -> None:
    """The flood goes on: another of its passwords is refused (429) after this moment."""
    refused = sum(1 for a in list(flood) if too_many(a))
    wait_for(lambda: sum(1 for a in list(flood) if too_many(a)) > refused, what="the flood to go on")


def test_a_password_flood_does_not_starve_an_authenticated_scraper(tmp_path: Path) -> None:
    # The flood comes from the scraper's own host and fills every place in the password queue; the
    # scraper, already verified, is answered from memory without a place, so it is served
    # throughout, while the flood's checks go on (at least ten of them) and its 429s keep coming.
    scraper = basic("prom", "pw")
    with counted_server(tmp_path, {"basic_auth_users": {"prom": hashed("pw", rounds=8)}}) as (srv, watcher):
        assert get(srv.port, headers=scraper)[0] == 200  # verified once, before the flood
        assert watcher.headers == [scraper["Authorization"]]
        with password_flood(srv.port) as flood:
            checks, scrapes = watcher.checks, 0
            deadline = time.monotonic() + NEVER_S
            while scrapes < 20 or watcher.checks < checks + 10:
                assert time.monotonic() < deadline, f"the flood made {watcher.checks - checks} checks"
                served(srv.port, headers=scraper)
                scrapes += 1
            still_flooding(flood)
        statuses = {a[0] for a in flood}
        assert statuses == {401, 429}, statuses
        assert all(too_many(a) for a in flood if a[0] == 429)
        assert watcher.most == 1, watcher.most
        # None of the scraper's requests took a check, and no check ran on the server's loop.
        assert watcher.headers.count(scraper["Authorization"]) == 1
        assert {name.rsplit("_", 1)[0] for name in watcher.threads} == {"basic-auth"}, watcher.threads


def test_a_scraper_not_yet_remembered_gets_in_during_a_flood(tmp_path: Path) -> None:
    # After a restart, or a new hash of the same password in the web config, the scraper's password
    # must go through bcrypt again while another host floods the checks: it gets a place, not 429.
    web = {"basic_auth_users": {"prom": hashed("pw", rounds=8)}}
    with counted_server(tmp_path, web) as (srv, watcher), password_flood(srv.port) as flood:
        scraper = basic("prom", "pw")
        assert watcher.remembered(srv.web.current(), scraper["Authorization"]) is None
        for _ in range(3):
            served(srv.port, headers=scraper, source="127.0.0.2")
        # Rotated: the same password, hashed again (a new salt), as htpasswd does.
        rehashed = hashed("pw", rounds=8)
        (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prom": rehashed}}))
        wait_for(lambda: srv.web.current().users["prom"] == rehashed.encode(), timeout=10, what="the reload")
        assert watcher.remembered(srv.web.current(), scraper["Authorization"]) is None
        for _ in range(3):
            served(srv.port, headers=scraper, source="127.0.0.2")
        # A reload that leaves the user's entry as it was keeps what was learnt: no bcrypt at all.
        same_entry = {
            "basic_auth_users": {"prom": rehashed},
            "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
        }
        (tmp_path / "web.yml").write_text(yaml.safe_dump(same_entry))
        wait_for(lambda: bool(srv.web.current().headers), timeout=10, what="the second reload")
        assert watcher.remembered(srv.web.current(), scraper["Authorization"]) is True
        served(srv.port, headers=scraper, source="127.0.0.2")
        # Each phase took the scraper's password through bcrypt once (a place made for it among
        # the flood's), the last one not at all; and the flood went on throughout.
        assert watcher.headers.count(scraper["Authorization"]) == 2
        still_flooding(flood)


@pytest.mark.parametrize(
    ("address", "key"),
    [("192.0.2.7", "192.0.2.7"), ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
     ("2001:db8:1:2:ffff:1:2:3", "2001:db8:1:2::/64"), ("::ffff:192.0.2.7", "192.0.2.7"),
     ("fe80::1%eth0", "fe80::/64"), ("", "")],
)  # fmt: skip
def test_one_host_is_one_ipv4_address_or_one_ipv6_slash_64(address: str, key: str) -> None:
    assert host_key(address) == key
