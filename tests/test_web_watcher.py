"""The web config in force (gpu_exporter/web/watcher.py): when a changed file or certificate is read
again, what a broken edit leaves in force, and what is logged.  The clock is the test's; the files
are real, their changes told apart by size or modification time as the watcher tells them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
import trustme
import yaml

from gpu_exporter.web import watcher as watcher_module
from gpu_exporter.web.config import load_web_config
from gpu_exporter.web.watcher import WebConfigWatcher
from tests.web_helpers import hashed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc))
    touch_later(path)


def touch_later(path: Path) -> None:
    """A modification time that differs from the last one, whatever this filesystem's granularity."""
    st = path.stat()
    later = st.st_mtime_ns + 1_000_000_000 * (1 + touch_later.n)  # type: ignore[attr-defined]
    touch_later.n += 1  # type: ignore[attr-defined]
    os.utime(path, ns=(later, later))


touch_later.n = 0  # type: ignore[attr-defined]


def users(w: WebConfigWatcher) -> set[str]:
    return set(w.current().users)


@pytest.fixture
def web(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    write(path, {"basic_auth_users": {"one": hashed("pw")}})
    return path


def test_a_changed_file_is_read_at_the_first_request_a_second_after_the_last_check(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now += 0.999
    assert users(w) == {"one"}  # within the second: not even looked at
    clock.now += 0.001
    assert users(w) == {"two"}


def test_a_check_that_finds_nothing_changed_starts_the_next_second(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    clock.now += 1.5
    assert users(w) == {"one"}  # checked at 1.5: nothing changed
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now += 0.9
    assert users(w) == {"one"}  # 0.9 s after that check
    clock.now += 0.1
    assert users(w) == {"two"}


def test_a_clock_that_steps_back_does_not_hold_reloads_off(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now -= 3600.0
    assert users(w) == {"two"}


def test_the_same_size_and_a_new_time_is_a_change(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    before = web.stat().st_size
    write(web, {"basic_auth_users": {"eno": hashed("pw")}})  # the same length
    assert web.stat().st_size == before
    clock.now += 1.0
    assert users(w) == {"eno"}


def test_a_broken_edit_keeps_the_last_good_config_says_so_once_and_the_fix_is_read(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    web.write_text("basic_auth_users: [broken")
    touch_later(web)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            clock.now += 1.0
            assert users(w) == {"one"}
    failed = [e for e in logs if e["event"] == "web_config_reload_failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == "error"  # once per change, not once a second
    assert str(web) in failed[0]["error"] and failed[0]["keeping"] == "the previous configuration"
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    with structlog.testing.capture_logs() as logs:
        clock.now += 1.0
        assert users(w) == {"two"}
    assert [e["event"] for e in logs] == ["web_config_reloaded"] and logs[0]["path"] == str(web)


def test_a_file_that_is_gone_keeps_the_config_and_its_return_is_read(web: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    web.unlink()
    clock.now += 1.0
    assert users(w) == {"one"}
    write(web, {"basic_auth_users": {"back": hashed("pw")}})
    clock.now += 1.0
    assert users(w) == {"back"}


def issue(ca: trustme.CA, name: str, crt: Path, key: Path) -> None:
    cert = ca.issue_cert(name)
    cert.cert_chain_pems[0].write_to_path(str(crt))
    cert.private_key_pem.write_to_path(str(key))


def watching_a_certificate(tmp_path: Path) -> tuple[trustme.CA, Path, Path, Clock, WebConfigWatcher]:
    """A watcher on a web config that serves tls.crt and tls.key, issued for first.example."""
    ca = trustme.CA()
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issue(ca, "first.example", crt, key)
    web = tmp_path / "web.yml"
    write(web, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}})
    clock = Clock()
    return ca, crt, key, clock, WebConfigWatcher(web, clock)


def edited_during_the_read(monkeypatch: pytest.MonkeyPatch, web: Path, doc: dict[str, Any]) -> None:
    """The next read of the web config finds ``doc`` written over it just after reading it: before
    any stat could see it."""

    def load_then_edited(path: Path | None) -> Any:
        monkeypatch.setattr(watcher_module, "load_web_config", load_web_config)  # once
        config = load_web_config(path)
        write(web, doc)
        return config

    monkeypatch.setattr(watcher_module, "load_web_config", load_then_edited)


def test_a_new_certificate_under_the_same_name_is_read(tmp_path: Path) -> None:
    ca, crt, key, clock, w = watching_a_certificate(tmp_path)
    old = w.current()
    issue(ca, "second.example", crt, key)
    touch_later(crt)
    touch_later(key)
    clock.now += 1.0
    assert w.current() is not old and w.current().tls is not None


def test_a_write_during_the_reload_is_read_at_the_next_check(web: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    edited_during_the_read(monkeypatch, web, {"basic_auth_users": {"three": hashed("pw")}})
    clock.now += 1.0
    assert users(w) == {"two"}
    clock.now += 1.0
    assert users(w) == {"three"}  # not taken for what was loaded a second ago


def test_a_renewed_certificate_of_the_same_size_copied_with_its_old_time_is_read(tmp_path: Path) -> None:
    # cp -p, rsync -t and tar keep the modification time; a renewed certificate is often the same size.
    ca, crt, key, clock, w = watching_a_certificate(tmp_path)
    old = w.current()
    kept, size = (crt.stat().st_mtime_ns, key.stat().st_mtime_ns), crt.stat().st_size
    # ECDSA signatures vary by a few bytes: issue until the renewed certificate is the same size.
    renewed = next(c for c in (ca.issue_cert("renew.example") for _ in range(200))
                   if len(c.cert_chain_pems[0].bytes()) == size)  # fmt: skip
    renewed.cert_chain_pems[0].write_to_path(str(crt))
    renewed.private_key_pem.write_to_path(str(key))
    assert crt.stat().st_size == size
    os.utime(crt, ns=(kept[0], kept[0]))
    os.utime(key, ns=(kept[1], kept[1]))
    clock.now += 1.0
    assert w.current() is not old


def test_a_write_during_a_reload_on_request_is_read_at_the_next_check(
    web: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    edited_during_the_read(monkeypatch, web, {"basic_auth_users": {"three": hashed("pw")}})
    w.install(web, w.read(web))  # what the daemon does on SIGHUP
    assert users(w) == {"two"}
    clock.now += 1.0
    assert users(w) == {"three"}


def test_a_write_during_the_first_read_is_read_at_the_first_check(web: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited_during_the_read(monkeypatch, web, {"basic_auth_users": {"two": hashed("pw")}})
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    assert users(w) == {"one"}
    clock.now += 1.0
    assert users(w) == {"two"}


def test_a_config_that_names_new_files_watches_them(tmp_path: Path) -> None:
    ca = trustme.CA()
    for name in ("a", "b"):
        cert = ca.issue_cert(f"{name}.example")
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.crt"))
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
    web = tmp_path / "web.yml"
    write(web, {"tls_server_config": {"cert_file": "a.crt", "key_file": "a.key"}})
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    write(web, {"tls_server_config": {"cert_file": "b.crt", "key_file": "b.key"}})
    clock.now += 1.0
    on_b = w.current()
    assert tmp_path / "b.crt" in on_b.files
    clock.now += 1.0
    assert w.current() is on_b  # nothing changed since: not loaded again
    (tmp_path / "b.key").write_text("not a key")
    touch_later(tmp_path / "b.key")
    with structlog.testing.capture_logs() as logs:
        clock.now += 1.0
        assert w.current() is on_b
    assert [e["event"] for e in logs] == ["web_config_reload_failed"]  # b.key is watched


def test_without_a_file_nothing_is_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    w = WebConfigWatcher(None, clock)
    first = w.current()

    def no_stat(files: Any) -> Any:
        raise AssertionError("stat without a web config file")

    monkeypatch.setattr(watcher_module, "_stat", no_stat)
    clock.now += 10.0
    assert w.current() is first and first.auth_required is False


def test_warnings_are_logged_once_per_load(web: Path) -> None:
    doc = {"basic_auth_users": {"one": hashed("pw")}, "http_server_config": {"http2": True}}
    write(web, doc)
    clock = Clock()
    with structlog.testing.capture_logs() as logs:
        w = WebConfigWatcher(web, clock)
        for _ in range(3):
            clock.now += 1.0
            w.current()
    warned = [e for e in logs if e["event"] == "web_config_not_applied"]
    assert len(warned) == 1 and "http2" in warned[0]["warning"] and warned[0]["log_level"] == "warning"
    write(web, {**doc, "basic_auth_users": {"two": hashed("pw")}})
    with structlog.testing.capture_logs() as logs:
        clock.now += 1.0
        w.current()
    assert [e["event"] for e in logs] == ["web_config_reloaded", "web_config_not_applied"]


def test_install_takes_the_config_given_and_starts_the_second_again(web: Path, tmp_path: Path) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock)
    other = tmp_path / "other.yml"
    write(other, {"basic_auth_users": {"other": hashed("pw")}, "http_server_config": {"http2": True}})
    clock.now += 5.0
    with structlog.testing.capture_logs() as logs:
        w.install(other, w.read(other))
    assert w.path == other and users(w) == {"other"}
    assert [e["event"] for e in logs] == ["web_config_not_applied"]
    with structlog.testing.capture_logs() as logs:
        clock.now += 1.0
        assert users(w) == {"other"}
    assert logs == []  # the install took the files' stamps: nothing to read again
    write(other, {"basic_auth_users": {"edited": hashed("pw")}})
    write(web, {"basic_auth_users": {"ignored": hashed("pw")}})  # no longer the file in force
    clock.now += 0.5
    assert users(w) == {"other"}  # a second after the last check, not before
    clock.now += 0.5
    assert users(w) == {"edited"}


class BlockedRead:
    """load_web_config that waits for the test before reading, as a file on a hung NFS mount would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.calls = 0
        real = load_web_config

        def load(path: Path | None) -> Any:
            self.calls += 1
            assert self.release.wait(30), "the test never released the read"
            return real(path)

        monkeypatch.setattr(watcher_module, "load_web_config", load)


def answered(w: WebConfigWatcher) -> set[str] | None:
    """What a request is answered with, asked from another thread: None where it does not return."""
    out: list[set[str]] = []
    asker = threading.Thread(target=lambda: out.append(users(w)), daemon=True)
    asker.start()
    asker.join(10)  # a deadline, not a speed: without the thread the request waits for the read itself
    return out[0] if out else None


def readers() -> int:
    return sum(t.name == "web-config-reload" for t in threading.enumerate())


def eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_in_the_daemon_a_slow_read_never_holds_a_request(web: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38, item 4: the web config was read on the event loop, so a file on a filesystem that does
    not answer held /metrics and /healthz.  The daemon's watcher reads in a thread of its own: requests
    are answered with the config in force meanwhile, and with the new one after."""
    clock = Clock()
    w = WebConfigWatcher(web, clock, run=watcher_module.in_thread)
    blocked = BlockedRead(monkeypatch)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now += 1.0
    assert answered(w) == {"one"}  # the look has begun, and its read will wait: the request does not
    assert eventually(lambda: blocked.calls == 1)
    clock.now += 5.0
    assert answered(w) == {"one"}
    assert readers() == 1  # one look at a time, however many requests
    blocked.release.set()
    assert eventually(lambda: users(w) == {"two"})


def test_a_sighup_during_a_slow_read_wins_over_it(web: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock, run=watcher_module.in_thread)
    other = tmp_path / "other.yml"
    write(other, {"basic_auth_users": {"other": hashed("pw")}})
    installed = w.read(other)
    blocked = BlockedRead(monkeypatch)
    write(web, {"basic_auth_users": {"stale": hashed("pw")}})
    clock.now += 1.0
    assert answered(w) == {"one"}
    assert eventually(lambda: blocked.calls == 1)
    w.install(other, installed)  # SIGHUP's reload, while the look at the old file waits
    blocked.release.set()
    assert eventually(lambda: not w._looking)
    assert users(w) == {"other"}  # not the file the look read


def test_no_thread_to_be_had_keeps_the_config_and_tries_again(web: Path) -> None:
    clock = Clock()
    tries = []

    def no_threads(check: Callable[[], None]) -> None:
        tries.append(check)
        raise RuntimeError("can't start new thread")

    w = WebConfigWatcher(web, clock, run=no_threads)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now += 1.0
    with structlog.testing.capture_logs() as logs:
        assert users(w) == {"one"}
    assert [e["event"] for e in logs] == ["web_config_reload_deferred"]
    clock.now += 1.0
    users(w)
    assert len(tries) == 2  # not stuck as if a look were still running


def test_a_look_that_hangs_holds_one_thread_however_long_it_hangs(web: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filesystem that stops answering, even the look (a stat) hangs: a look a second would pile
    up a thread a second.  One look at a time, and its thread never holds the daemon's exit."""
    release, calls = threading.Event(), [0]
    real = watcher_module._stat

    def hung_stat(files: Any) -> Any:
        calls[0] += 1
        assert release.wait(30), "the test never released the look"
        return real(files)

    clock = Clock()
    w = WebConfigWatcher(web, clock, run=watcher_module.in_thread)
    monkeypatch.setattr(watcher_module, "_stat", hung_stat)
    for _ in range(5):
        clock.now += 1.0
        assert answered(w) == {"one"}
    assert eventually(lambda: calls[0] == 1)
    assert readers() == 1 and calls[0] == 1
    assert all(t.daemon for t in threading.enumerate() if t.name == "web-config-reload")
    release.set()
    assert eventually(lambda: readers() == 0)
    write(web, {"basic_auth_users": {"two": hashed("pw")}})
    clock.now += 1.0
    users(w)
    assert eventually(lambda: users(w) == {"two"})  # the look is free again once the last one ended


def test_a_second_sighup_during_a_slow_read_wins(web: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    w = WebConfigWatcher(web, clock, run=watcher_module.in_thread)
    first, second = tmp_path / "first.yml", tmp_path / "second.yml"
    write(first, {"basic_auth_users": {"first": hashed("pw")}})
    write(second, {"basic_auth_users": {"second": hashed("pw")}})
    w.install(first, w.read(first))  # an install before the look begins
    late = w.read(second)
    blocked = BlockedRead(monkeypatch)
    write(first, {"basic_auth_users": {"stale": hashed("pw")}})
    clock.now += 1.0
    assert answered(w) == {"first"}
    assert eventually(lambda: blocked.calls == 1)
    w.install(second, late)  # and one while it reads
    blocked.release.set()
    assert eventually(lambda: not w._looking)
    assert users(w) == {"second"}
