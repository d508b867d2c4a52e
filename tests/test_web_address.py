"""The listen address, and that reading the settings does not import the web server to parse it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpu_exporter.web.address import parse_listen_address

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("address", "parsed"),
    [(":9445", ("0.0.0.0", 9445)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9445", ("::1", 9445)),
     ("[::]:65535", ("::", 65535)), ("node-1.example:80", ("node-1.example", 80)),
     ("XL-node-X:9445", ("XL-node-X", 9445))],  # only the brackets are taken off
)  # fmt: skip
def test_addresses_as_prometheus_exporters_take_them(address: str, parsed: tuple[str, int]) -> None:
    assert parse_listen_address(address) == parsed


@pytest.mark.parametrize(
    "address", ["9445", "127.0.0.1", ":65536", ":-1", ":port", ":", "[::1]:", ":\u00b2", ":\u0661"]
)
def test_a_bad_address_is_refused_by_name(address: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_listen_address(address)
    assert repr(address) in str(e.value) and "HOST:PORT" in str(e.value)


def test_reading_the_settings_does_not_import_the_web_server() -> None:
    # asyncio and ssl come with structlog and the settings' own CA files; the server's modules must not.
    code = (
        "import sys, json; from gpu_exporter.settings.config import load_settings; "
        "load_settings({'web_listen_address': '127.0.0.1:9999'}); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpu_exporter.web'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == ["gpu_exporter.web", "gpu_exporter.web.address"]
