"""RSS of the daemon with 1,000 handshake-only TLS connections, and after they close.

Each case starts a fresh daemon (8 simulated GPUs, TLS on), measures RSS after a few scrapes,
opens 1,000 TLS connections that complete the handshake and send nothing (the server may close
the oldest to make room; the client then opens the next), records the highest RSS, closes them all
and records RSS 15 s later.  The cases run one after the other on the same machine:

- this tree;
- this tree with ``MALLOC_ARENA_MAX=2`` (does glibc's per-thread arenas matter?);
- ``--against REV``, another revision (the code before the fix), if given.

    .venv/bin/python benchmarks/tls_memory.py --against 5df7fb2

Writes benchmarks/results/tls-memory.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one_case(name: str, tree: Path, web: Path, ca: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_exporter", "--simulate", "--simulate.gpus", "8", "--web.listen-address",
         "127.0.0.1:0", "--log.format", "json", "--web.config.file", str(web)],
        cwd=tree, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = 0
        while not port:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit(f"{name}: the daemon exited")
            entry = json.loads(line)
            port = int(entry["port"]) if entry.get("event") == "listening" else 0
        threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
        ctx = ssl.create_default_context(cafile=str(ca))
        for _ in range(5):
            raw = socket.create_connection(("127.0.0.1", port))
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                while s.recv(65536):
                    pass
        time.sleep(1)
        base = rss_mib(proc.pid)
        peak = base
        held: list[ssl.SSLSocket] = []
        t0 = time.monotonic()
        for i in range(1000):
            with contextlib.suppress(OSError):
                raw = socket.create_connection(("127.0.0.1", port), timeout=10)
                held.append(ctx.wrap_socket(raw, server_hostname="127.0.0.1"))
            if i % 25 == 0:
                peak = max(peak, rss_mib(proc.pid))
        opened_in = time.monotonic() - t0
        time.sleep(1)
        peak = max(peak, rss_mib(proc.pid))
        for s in held:
            s.close()
        time.sleep(15)
        after = rss_mib(proc.pid)
        return {"case": name, "base_mib": base, "peak_mib": peak, "after_15s_mib": after,
                "per_connection_kib": (peak - base) * 1024 / 1000, "seconds_to_open": opened_in}  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", metavar="REV", help="also measure this git revision")
    args = ap.parse_args()
    import trustme
    import yaml

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
        ca.cert_pem.write_to_path(str(tmp / "ca.crt"))
        web = tmp / "web.yml"
        web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}))
        ca_file = tmp / "ca.crt"
        cases = [one_case("this tree", ROOT, web, ca_file, {}),
                 one_case("this tree, MALLOC_ARENA_MAX=2", ROOT, web, ca_file, {"MALLOC_ARENA_MAX": "2"})]  # fmt: skip
        if args.against:
            tree = tmp / "tree"
            tree.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against], check=True,
                                     capture_output=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            cases.append(one_case(args.against, tree, web, tmp / "ca.crt", {}))
    describe = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "revision": describe, "cases": cases}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tls-memory.json").write_text(json.dumps(res, indent=2))
    lines = [
        "# RSS with 1,000 handshake-only TLS connections",
        "",
        f"{res['date']}; this tree is {describe}. 8 simulated GPUs, TLS on; 1,000 connections complete the "
        "handshake and send nothing; RSS measured before, at its highest while they open, and 15 s after they "
        "close (the server keeps at most 512 open and closes the oldest to make room).",
        "",
        "| case | before | highest | 15 s after closing | (highest - before) / 1,000, KiB | s to open |",
        "|---|---|---|---|---|---|",
        *(f"| {c['case']} | {c['base_mib']:.1f} MiB | {c['peak_mib']:.1f} MiB | {c['after_15s_mib']:.1f} MiB | "
          f"{c['per_connection_kib']:.0f} | {c['seconds_to_open']:.1f} |" for c in cases),
        "",
    ]  # fmt: skip
    (RESULTS / "tls-memory.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
