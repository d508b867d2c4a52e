"""Bad input from a clumsy operator: each gets exit 2 (``--once``, a monitoring check: 3, UNKNOWN) and a
short message naming the setting or file.

Never a traceback, never a message about something else, never a message of megabytes; and
``--once`` checks what the daemon checks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trustme
import yaml

from gpu_exporter.web.config import WebConfigError, load_web_config
from tests.timing import NEVER_S
from tests.web_helpers import fixed_hash, tls_files

pytestmark = pytest.mark.integration

BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
poll_interval: [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def daemon(*args: str, env: dict[str, str] | None = None, timeout: float = NEVER_S) -> subprocess.CompletedProcess[str]:
    """The daemon (simulated GPUs), expected to refuse to start."""
    cmd = [sys.executable, "-m", "gpu_exporter", "--simulate", "--web.listen-address", "127.0.0.1:0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def once(*args: str, env: dict[str, str] | None = None, timeout: float = NEVER_S) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpu_exporter", "--simulate", "--once", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def refused(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    expected = 3 if "--once" in out.args else 2  # a check that cannot check is UNKNOWN
    assert out.returncode == expected, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith("gpu-exporter: "), out.stderr[:500]
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[:2000])


# -- 5. files that are not UTF-8, JSON that is not JSON, YAML that explodes ---------------------------------
def test_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"poll_interval: 5s\nnode_name: caf\xe9\n")
    for run in (daemon, once):
        refused(run("--config", str(cfg)), str(cfg), "UTF-8")


def test_a_web_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_bytes(b"basic_auth_users:\n  caf\xe9: x\n")
    with pytest.raises(WebConfigError, match="UTF-8"):
        load_web_config(web)
    for run in (daemon, once):
        refused(run("--web.config.file", str(web)), str(web), "UTF-8")


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("GPU_EXPORTER_RULES", "{not json"),
        ("GPU_EXPORTER_ALERTING", "{'alertmanagers': []}"),
        ("GPU_EXPORTER_ALERTING__ALERTMANAGERS", '[{"url": "http://am:9093"'),
    ],
)
def test_invalid_json_in_the_environment(var: str, value: str) -> None:
    import os

    env = {**os.environ, var: value}
    for run in (daemon, once):
        refused(run(env=env), var, "JSON")


def test_a_billion_laughs_config_gives_a_short_message_quickly(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 600
    # Quickly: within the run's timeout (NEVER_S); walking the 387 million values the aliases stand
    # for would take many minutes.
    out = once("--config", str(cfg))
    refused(out, str(cfg))
    assert len(out.stderr) < 4096, len(out.stderr)


def test_a_billion_laughs_web_config_gives_a_short_message(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(BILLION_LAUGHS.replace("poll_interval", "basic_auth_users"))
    with pytest.raises(WebConfigError) as e:
        load_web_config(web)
    assert len(str(e.value)) < 4096 and str(web) in str(e.value)


def test_a_long_bad_value_is_cut_short_in_the_message(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"node_name": ["x" * 100] * 10_000}))
    out = once("--config", str(cfg))
    refused(out, "node_name")
    assert len(out.stderr) < 4096


# -- 6. a file named by a setting that is missing ----------------------------------------------------------
def test_a_missing_receiver_ca_file_names_the_setting_and_the_file(tmp_path: Path) -> None:
    # The README's own example.
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "alerting:\n  alertmanagers:\n    - url: https://am.example:9093\n      ca_file: /etc/ssl/internal-ca.pem\n"
    )
    for run in (daemon, once):
        out = run("--config", str(cfg))
        refused(out, "alerting.alertmanagers.0.ca_file", "/etc/ssl/internal-ca.pem")
        assert "cannot listen" not in out.stderr


def test_a_receiver_ca_file_that_is_not_a_certificate(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"alerting:\n  webhooks:\n    - url: https://hook.example/x\n      ca_file: {bad}\n")
    refused(once("--config", str(cfg)), "alerting.webhooks.0.ca_file", str(bad))


def test_once_checks_the_web_config_like_the_daemon(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}))
    refused(once("--web.config.file", str(web)), str(web), "missing.crt")


def test_once_with_a_good_web_config_runs(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}))
    out = once("--web.config.file", str(web))
    assert out.returncode in (0, 1, 2), out.stderr  # the simulated GPUs' findings, never UNKNOWN


# -- 7. web config values that would break every request -------------------------------------------------
GOOD_HASH = fixed_hash("pw")


@pytest.mark.parametrize(
    ("web", "needles"),
    [
        ({"basic_auth_users": {"prom": GOOD_HASH[:4] + "99" + GOOD_HASH[6:]}}, ["basic_auth_users.prom", "cost"]),
        ({"basic_auth_users": {"prom": GOOD_HASH[:4] + "03" + GOOD_HASH[6:]}}, ["basic_auth_users.prom", "cost"]),
        ({"basic_auth_users": {"prom": GOOD_HASH[:-1] + "!"}}, ["basic_auth_users.prom", "bcrypt"]),
        ({"http_server_config": {"headers": {"X-Frame-Options": "d\u00e9ny \u2603"}}},
         ["http_server_config.headers.X-Frame-Options", "Latin-1"]),
        ({"http_server_config": {"headers": {"X-Frame-Options": "deny\r\nSet-Cookie: evil=1"}}},
         ["http_server_config.headers.X-Frame-Options", "control character"]),
        ({"http_server_config": {"headers": {"X-Frame-Options": "deny\nX: y"}}},
         ["http_server_config.headers.X-Frame-Options", "control character"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13", "max_version": "TLS12"}},
         ["min_version", "max_version"]),
    ],
)  # fmt: skip
def test_web_config_values_that_break_every_request_are_refused(
    tmp_path: Path, web: dict[str, object], needles: list[str]
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(web, allow_unicode=True))
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
    for run in (daemon, once):
        refused(run("--web.config.file", str(path)), str(path), needles[0])
