"""Basic auth (gpu_exporter/web/auth.py): the header read, bcrypt's answer remembered, the bounded
queue of checks, and what counts as one client host.  Fast: the server tests over real sockets are
in test_web_hostile.py and test_web_security.py."""

from __future__ import annotations

import asyncio
import base64
import threading
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest
import yaml

from gpu_exporter.web import auth
from gpu_exporter.web.auth import PasswordGate, Passwords, host_key, parse_basic
from gpu_exporter.web.config import WebConfig, load_web_config
from tests.web_helpers import basic, hashed

PW = hashed("pw")


def config(tmp_path: Path, users: dict[str, str]) -> WebConfig:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": users}))
    return load_web_config(path)


def header(user: str, password: str) -> str:
    return basic(user, password)["Authorization"]


# -- the header -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "parsed"),
    [(header("prom", "pw"), ("prom", "pw")), (header("prom", ""), ("prom", "")), (header("", "pw"), ("", "pw")),
     (header("prom", "a:b"), ("prom", "a:b")), ("basic " + base64.b64encode(b"u:p").decode(), ("u", "p")),
     ("BASIC " + base64.b64encode(b"u:p").decode(), ("u", "p")), ("  Basic  dTpw  ", ("u", "p")),
     (header("pr\u00f6m", "p\u00e4ss"), ("pr\u00f6m", "p\u00e4ss"))],
)  # fmt: skip
def test_a_basic_auth_header(value: str, parsed: tuple[str, str]) -> None:
    assert parse_basic(value) == parsed


@pytest.mark.parametrize(
    "value",
    [None, "", "Basic", "Basic ", "Bearer dTpw", "Basic dTpw!", "Basic dXNlcg==", "Basic dTpw dTpw",
     "Basic " + base64.b64encode(b"\xff:p").decode(), "Digest username=u"],
)  # fmt: skip
def test_what_is_not_a_basic_auth_header(value: str | None) -> None:
    assert parse_basic(value) == (None, None)


# -- the checker ------------------------------------------------------------------------------------------
def test_right_wrong_and_unknown(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    passwords = Passwords()
    assert passwords.check(cfg, header("prom", "pw")) is True
    assert passwords.check(cfg, header("prom", "wrong")) is False
    assert passwords.check(cfg, header("mallory", "pw")) is False  # checked against the decoy, never let in
    assert passwords.check(cfg, None) is False and passwords.check(cfg, "Basic !!") is False


def test_an_unknown_user_with_a_configured_users_password_is_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW, "other": hashed("x")})
    assert Passwords().check(cfg, header("nobody", "pw")) is False


def test_answers_are_remembered_under_user_stored_hash_and_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, {"prom": PW})
    passwords = Passwords()
    assert passwords.remembered(cfg, header("prom", "pw")) is None
    assert passwords.remembered(cfg, None) is False and passwords.remembered(cfg, "Bearer x") is False
    passwords.check(cfg, header("prom", "pw"))
    passwords.check(cfg, header("prom", "bad"))
    calls: list[tuple[bytes, bytes]] = []

    def counted(password: bytes, hashed: bytes) -> bool:
        calls.append((password, hashed))
        return False

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    assert passwords.remembered(cfg, header("prom", "pw")) is True
    assert passwords.remembered(cfg, header("prom", "bad")) is False
    assert passwords.check(cfg, header("prom", "pw")) is True and calls == []  # from memory: no bcrypt
    # A new hash of the same password forgets both answers; another user's entry changes nothing.
    rehashed = config(tmp_path, {"prom": hashed("pw")})
    assert passwords.remembered(rehashed, header("prom", "pw")) is None
    assert passwords.remembered(rehashed, header("prom", "bad")) is None
    same = config(tmp_path, {"prom": PW, "new": hashed("y")})
    assert passwords.remembered(same, header("prom", "pw")) is True


def test_remembered_answers_are_bounded_least_recently_used_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, {"prom": PW})
    monkeypatch.setattr(auth, "_REMEMBER_GOOD", 2)
    monkeypatch.setattr(auth, "_REMEMBER_BAD", 3)
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, hashed: password.startswith(b"good"))
    passwords = Passwords()
    for p in ("good1", "good2"):
        assert passwords.check(cfg, header("prom", p))
    assert passwords.remembered(cfg, header("prom", "good1")) is True  # used: good2 is now the oldest
    assert passwords.check(cfg, header("prom", "good3"))
    assert [passwords.remembered(cfg, header("prom", p)) for p in ("good1", "good2", "good3")] == [True, None, True]
    for p in ("bad1", "bad2", "bad3", "bad4"):
        assert not passwords.check(cfg, header("prom", p))
    assert [passwords.remembered(cfg, header("prom", p)) for p in ("bad1", "bad2", "bad4")] == [None, False, False]


def test_a_hash_bcrypt_cannot_read_is_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, {"prom": PW})

    def unreadable(password: bytes, hashed: bytes) -> bool:
        raise ValueError("Invalid salt")

    monkeypatch.setattr(bcrypt, "checkpw", unreadable)
    passwords = Passwords()
    assert passwords.check(cfg, header("prom", "pw")) is False
    assert passwords.remembered(cfg, header("prom", "pw")) is False


def test_the_decoy_is_the_costliest_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cheap, dear = hashed("a", rounds=4), hashed("b", rounds=6)
    cfg = config(tmp_path, {"x": cheap, "y": dear, "z": hashed("c", rounds=5)})
    assert cfg.decoy_hash == dear.encode()
    seen: list[bytes] = []

    def matches(password: bytes, hashed: bytes) -> bool:
        seen.append(hashed)
        return True

    monkeypatch.setattr(bcrypt, "checkpw", matches)
    assert Passwords().check(cfg, header("nobody", "b")) is False  # even a "match" against the decoy
    assert seen == [dear.encode()]


# -- the queue of checks ------------------------------------------------------------------------------------
class Held(Passwords):
    """Checks that wait for ``release``, counting how many run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.running = self.most = 0
        self._lock = threading.Lock()

    def check(self, config: WebConfig, header: str | None) -> bool:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            assert self.release.wait(30)
            return header == basic("prom", "pw")["Authorization"]
        finally:
            with self._lock:
                self.running -= 1


def test_the_gate_bounds_checks_in_all_and_per_host(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    held = Held()
    gate = PasswordGate(held, workers=1, queue=2, per_host=2)

    async def scene() -> list[bool | None]:
        first = [asyncio.create_task(gate.authenticate(cfg, header("prom", f"p{i}"), "a")) for i in range(2)]
        await asyncio.sleep(0.05)
        # Host "a" holds its two places: a third from it is refused at once, another host gets the last place.
        refused_a = await gate.authenticate(cfg, header("prom", "p9"), "a")
        b = asyncio.create_task(gate.authenticate(cfg, header("prom", "pw"), "b"))
        await asyncio.sleep(0.05)
        refused_c = await gate.authenticate(cfg, header("prom", "p8"), "c")  # 1 running + 2 waiting: full
        held.release.set()
        return [refused_a, refused_c, *await asyncio.gather(*first), await b]

    try:
        assert asyncio.run(scene()) == [None, None, False, False, True]
    finally:
        gate.shutdown()
    assert held.most == 1


def test_places_are_given_back_after_a_check(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    held = Held()
    held.release.set()
    gate = PasswordGate(held, workers=1, queue=0, per_host=1)

    async def scene() -> list[bool | None]:
        return [await gate.authenticate(cfg, header("prom", p), "a") for p in ("x", "pw", "y")]

    try:
        assert asyncio.run(scene()) == [False, True, False]  # one at a time, each after the last: never refused
        assert gate._by_host == {} and gate._pending == 0
    finally:
        gate.shutdown()


def test_a_remembered_answer_needs_no_place(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    passwords = Passwords()
    assert passwords.check(cfg, header("prom", "pw"))
    gate = PasswordGate(passwords, workers=1, queue=0, per_host=0)  # no place for anyone

    async def scene() -> list[bool | None]:
        return [await gate.authenticate(cfg, header("prom", "pw"), "a"), await gate.authenticate(cfg, None, "a"),
                await gate.authenticate(cfg, header("prom", "new"), "a")]  # fmt: skip

    try:
        assert asyncio.run(scene()) == [True, False, None]
    finally:
        gate.shutdown()


def test_a_failed_check_rests_as_long_as_it_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, {"prom": PW})
    clock = iter([10.0, 10.25, 20.0, 20.5])
    slept: list[float] = []
    # Only the module's own view of time: other threads keep the real clock.
    monkeypatch.setattr(
        "gpu_exporter.web.auth.time", SimpleNamespace(monotonic=lambda: next(clock), sleep=slept.append)
    )
    gate = PasswordGate(Passwords(), workers=1)
    try:
        assert gate._check_paced(cfg, header("prom", "wrong")) is False
        assert gate._check_paced(cfg, header("prom", "pw")) is True
    finally:
        gate.shutdown()
    assert slept == [0.25]  # the failure rested 0.25 s; the success did not rest


# -- one client host --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "key"),
    [("192.0.2.7", "192.0.2.7"), ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
     ("2001:db8:1:2:ffff:1:2:3", "2001:db8:1:2::/64"), ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
     ("::ffff:192.0.2.7", "192.0.2.7"), ("fe80::1%eth0", "fe80::/64"), ("", ""), ("not-an-ip", "not-an-ip")],
)  # fmt: skip
def test_one_host_is_one_ipv4_address_or_one_ipv6_slash_64(address: str, key: str) -> None:
    assert host_key(address) == key


def test_each_user_is_checked_against_their_own_hash(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"cheap": hashed("one", rounds=4), "dear": hashed("two", rounds=5)})
    passwords = Passwords()
    assert passwords.check(cfg, header("cheap", "one")) is True  # not against the decoy (dear's hash)
    assert passwords.check(cfg, header("dear", "two")) is True
    assert passwords.check(cfg, header("cheap", "two")) is False


@pytest.mark.parametrize(("password", "remembered"), [("p" * 72, None), ("\u00e9" * 36, None), ("p" * 73, False),
                                                      ("\u00e9" * 36 + "p", False)])  # fmt: skip
def test_a_password_over_72_bytes_is_wrong_without_a_check(
    tmp_path: Path, password: str, remembered: bool | None
) -> None:
    cfg = config(tmp_path, {"prom": PW})
    assert Passwords().remembered(cfg, header("prom", password)) is remembered


def test_an_unreadable_hash_is_logged_paced_and_only_with_a_configured_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from structlog.testing import capture_logs

    from gpu_exporter.web.pacing import Pacer

    cfg = config(tmp_path, {"prom": PW})

    def unreadable(password: bytes, hashed: bytes) -> bool:
        raise ValueError("Invalid salt")

    monkeypatch.setattr(bcrypt, "checkpw", unreadable)
    now = [0.0]
    passwords = Passwords(Pacer(60.0, lambda: now[0]))
    with capture_logs() as logs:
        for i in range(5):
            assert passwords.check(cfg, header("prom", f"p{i}")) is False
        now[0] = 60.0
        assert passwords.check(cfg, header("x" * 10_000, "p")) is False
    assert [(line["event"], line["user"], line["held_back"]) for line in logs] == [
        ("basic_auth_hash_unreadable", "prom", 0), ("basic_auth_hash_unreadable", None, 4)]  # fmt: skip
    assert Passwords()._pacer.every == 60.0


def test_checks_run_in_basic_auth_threads_with_the_config_given(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    seen: list[tuple[str, WebConfig]] = []

    class Recording(Passwords):
        def check(self, config: WebConfig, header: str | None) -> bool:
            seen.append((threading.current_thread().name, config))
            return True

    gate = PasswordGate(Recording())
    try:
        assert asyncio.run(gate.authenticate(cfg, header("prom", "new"), "a")) is True
    finally:
        gate.shutdown()
    assert seen[0][0].startswith("basic-auth") and seen[0][1] is cfg


def test_by_default_one_check_runs_four_wait_and_one_host_holds_one_place(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    held = Held()
    gate = PasswordGate(held)

    async def scene() -> list[bool | None]:
        first = asyncio.create_task(gate.authenticate(cfg, header("prom", "a0"), "a"))
        await asyncio.sleep(0.05)
        same_host = await gate.authenticate(cfg, header("prom", "a1"), "a")
        others = [asyncio.create_task(gate.authenticate(cfg, header("prom", f"h{i}"), f"h{i}")) for i in range(4)]
        await asyncio.sleep(0.05)
        sixth = await gate.authenticate(cfg, header("prom", "z"), "z")
        held.release.set()
        return [same_host, sixth, await first, *await asyncio.gather(*others)]

    try:
        assert asyncio.run(scene()) == [None, None, False, False, False, False, False]
    finally:
        gate.shutdown()
    assert held.most == 1


def test_shutdown_neither_waits_for_a_check_nor_runs_those_waiting(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"prom": PW})
    held = Held()
    gate = PasswordGate(held, workers=1, queue=2, per_host=3)
    outcome: list[str] = []

    async def scene() -> None:
        running = asyncio.create_task(gate.authenticate(cfg, header("prom", "a"), "a"))
        waiting = asyncio.create_task(gate.authenticate(cfg, header("prom", "b"), "a"))
        await asyncio.sleep(0.05)
        stopper = threading.Thread(target=gate.shutdown)
        stopper.start()
        stopper.join(5)
        outcome.append("returned" if not stopper.is_alive() else "blocked")
        held.release.set()
        results = await asyncio.gather(running, waiting, return_exceptions=True)
        outcome.append(type(results[1]).__name__)

    asyncio.run(scene())
    assert outcome == ["returned", "CancelledError"]
