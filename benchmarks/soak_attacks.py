"""Soak under attack: the hostile clients of issue 12, all at once, while a good scraper is timed.

The daemon serves 8 fake H100s with TLS and basic auth on (bcrypt cost 10). An attacker process
on the same machine holds, for the whole run, and reconnects one second after the server closes
any of them:
1. 2,000 idle TCP sockets, and 1,000 TLS sockets that fetched /healthz once and sit on keep-alive;
2. 45 connections that each send 200 pipelined, authenticated GET /metrics and read nothing;
3. 1,000 TLS connections that complete the handshake and send nothing;
4. 50 connections sending wrong passwords as fast as they are answered.

Meanwhile a good scraper (correct password, a fresh TLS connection each time, as after a restart)
fetches /metrics once a second, and a kubelet-like probe fetches /healthz once a second. Their
latency is measured before the attack (baseline) and during it; the daemon's RSS, threads and open
files every 5 s.

    .venv/bin/python benchmarks/soak_attacks.py                 # 30 s baseline, 5 min attack
    .venv/bin/python benchmarks/soak_attacks.py --minutes 1 --against 5df7fb2 --tag before

``--against REV`` runs the daemon of that git revision instead (from ``git archive``), for a
before/after comparison.  Writes benchmarks/results/soak-attacks[-TAG].md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import json
import os
import platform
import random
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
USER, PASSWORD = "prometheus", "good-password"


# -- the attacker (its own process) ------------------------------------------------------------------------
async def _hold(reader: asyncio.StreamReader) -> None:
    """Until the server closes the connection."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, ssl.SSLError):
        while await reader.read(65536):
            pass


async def _slot(kind: str, port: int, ctx: ssl.SSLContext, counts: dict[str, int]) -> None:
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    while True:
        writer = None
        try:
            tls = None if kind == "idle" else ctx
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls else None),
                30,
            )
            counts[kind] += 1
            if kind == "keepalive":
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                await _hold(reader)
            elif kind in ("idle", "handshake"):
                await _hold(reader)
            elif kind == "pipeline":
                req = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n".encode()
                writer.write(req * 200)
                while True:  # read nothing; a write fails once the server has given up on us
                    await asyncio.sleep(5)
                    writer.write(req)
                    await asyncio.wait_for(writer.drain(), 60)
            elif kind == "flood":
                while True:
                    guess = base64.b64encode(f"{USER}:{random.random()}".encode()).decode()
                    writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {guess}\r\n\r\n".encode())
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), 0)  # fmt: skip
                    await reader.readexactly(length)
                    counts["flood_answers"] += 1
                    if b"Connection: close" in head:
                        break
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.LimitOverrunError):
            counts[kind + "_errors"] += 1
        finally:
            if writer is not None:
                writer.transport.abort()
        await asyncio.sleep(1.0)  # a patient attacker: back one second after being closed


async def attack(port: int, cafile: str) -> None:
    ctx = ssl.create_default_context(cafile=cafile)
    counts: dict[str, int] = {}
    plan = {"idle": 2000, "keepalive": 1000, "handshake": 1000, "pipeline": 45, "flood": 50}
    for kind in plan:
        counts[kind] = counts[kind + "_errors"] = 0
    counts["flood_answers"] = 0

    def report() -> None:  # from a thread: the attacker's loop is saturated by design
        while True:
            time.sleep(5)
            print(json.dumps(counts), flush=True)

    threading.Thread(target=report, daemon=True).start()
    tasks = [asyncio.create_task(_slot(kind, port, ctx, counts)) for kind, n in plan.items() for _ in range(n)]
    await asyncio.gather(*tasks)


def attacker_main(port: int, cafile: str) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(attack(port, cafile))


# -- the measurement --------------------------------------------------------------------------------------
def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}  # fmt: skip


def fetch(port: int, ctx: ssl.SSLContext, path: str, headers: dict[str, str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        # The TLS connection made by hand: http.client's own connect adds ~40 ms of delayed ACK to
        # every small answer, old server and new alike, which would hide the server's latency.
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status, time.perf_counter() - t0
    except (OSError, http.client.HTTPException) as e:
        return -_ERRORS.setdefault(type(e).__name__, len(_ERRORS) + 1), time.perf_counter() - t0
    finally:
        conn.close()


_ERRORS: dict[str, int] = {}  # exception name -> code (negative statuses stand for them)


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return {"p50_ms": q[49] * 1000, "p90_ms": q[89] * 1000, "p99_ms": q[98] * 1000, "max_ms": max(xs) * 1000}


class Timed:
    """A good scraper and a probe, once a second each, in their own threads."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.port, self.ctx = port, ctx
        self.results: dict[str, list[tuple[float, int, float]]] = {"scrape": [], "probe": []}
        self.stop = threading.Event()
        auth = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
        self._threads = [threading.Thread(target=self._loop, args=("scrape", "/metrics", auth), daemon=True),
                         threading.Thread(target=self._loop, args=("probe", "/healthz", {}), daemon=True)]  # fmt: skip

    def _loop(self, name: str, path: str, headers: dict[str, str]) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            status, took = fetch(self.port, self.ctx, path, headers)
            self.results[name].append((t, status, took))
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def summary(self, since: float, until: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, rows in self.results.items():
            window = [r for r in rows if since <= r[0] < until]
            ok = [took for _, status, took in window if status == 200]
            names = {-code: name for name, code in _ERRORS.items()}
            out[name] = {"requests": len(window), "ok": len(ok),
                         "failed": {names.get(s, str(s)): sum(1 for _, st, _ in window if st == s) for s in
                                    sorted({st for _, st, _ in window if st != 200})},
                         **percentiles(ok)}  # fmt: skip
        return out


def source_tree(rev: str | None, tmp: Path) -> Path:
    if rev is None:
        return ROOT
    dest = tmp / "tree"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def describe() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="how long the attack is held (default 5)")
    ap.add_argument("--baseline", type=float, default=30.0, help="seconds measured before the attack (default 30)")
    ap.add_argument("--against", metavar="REV", help="run the daemon of this git revision")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    ap.add_argument("--attacker", nargs=2, metavar=("PORT", "CAFILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attacker:
        attacker_main(int(args.attacker[0]), args.attacker[1])
        return 0

    import bcrypt
    import trustme
    import yaml

    from tests.fakenvml import build_library, subprocess_env
    from tests.fakenvml.presets import preset

    build_library()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tree = source_tree(args.against, tmp)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
        ca.cert_pem.write_to_path(str(tmp / "ca.crt"))
        (tmp / "web.yml").write_text(yaml.safe_dump({
            "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
            "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()},
        }))  # fmt: skip
        scenario = preset("h100-8x-training", tmp / "node.scn")
        scenario.write()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
             "--web.config.file", str(tmp / "web.yml"), *(["--log.level", "debug"] if args.against is None else [])],
            cwd=tree, env=subprocess_env(scenario.path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
                resource.RLIMIT_NOFILE)[1])),  # a pod's usual soft limit; the daemon may raise it
        )  # fmt: skip
        attacker: subprocess.Popen[str] | None = None
        samples: list[dict[str, Any]] = []
        attack_counts: dict[str, int] = {}
        try:
            assert daemon.stderr is not None
            port = 0
            while not port:
                line = daemon.stderr.readline()
                if not line:
                    raise SystemExit(f"the daemon exited: rc={daemon.wait()}")
                entry = json.loads(line)
                port = int(entry["port"]) if entry.get("event") == "listening" else 0
            daemon_log: list[dict[str, Any]] = []

            def drain() -> None:
                for line in daemon.stderr or []:
                    with contextlib.suppress(ValueError):
                        entry = json.loads(line)
                        if entry.get("event") == "http_connections":
                            daemon_log.append(entry)

            threading.Thread(target=drain, daemon=True).start()
            ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
            timed = Timed(port, ctx)
            timed.start()
            t0 = time.monotonic()

            def sample(phase: str) -> None:
                samples.append({"t": round(time.monotonic() - t0, 1), "phase": phase, **proc_stats(daemon.pid)})

            while time.monotonic() - t0 < args.baseline:
                sample("baseline")
                time.sleep(5)
            attack_start = time.monotonic()
            attacker = subprocess.Popen([sys.executable, __file__, "--attacker", str(port), str(tmp / "ca.crt")],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip

            def read_counts() -> None:
                assert attacker is not None and attacker.stdout is not None
                for line in attacker.stdout:
                    attack_counts.update(json.loads(line))

            threading.Thread(target=read_counts, daemon=True).start()
            while time.monotonic() - attack_start < args.minutes * 60:
                if daemon.poll() is not None:
                    raise SystemExit(f"the daemon died under attack: rc={daemon.returncode}")
                sample("attack")
                time.sleep(5)
            attack_end = time.monotonic()
            attacker.kill()
            attacker.wait()
            attacker = None
            time.sleep(15)  # after the attack: is the memory given back?
            sample("after")
            timed.stop.set()
            baseline = timed.summary(t0, attack_start)
            # The first 10 s of the attack are its ramp-up (4,000 sockets opening); measure the rest.
            during = timed.summary(attack_start + 10, attack_end)
        finally:
            if attacker is not None:
                attacker.kill()
            daemon.kill()
            daemon.wait()
    base_rss = [s["rss_mib"] for s in samples if s["phase"] == "baseline"]
    attack_rows = [s for s in samples if s["phase"] == "attack"]
    res: dict[str, Any] = {
        "machine": machine(),
        "revision": args.against or describe(),
        "attack_minutes": args.minutes,
        "baseline": baseline,
        "attack": during,
        "attacker_counts": attack_counts,
        "server_connections_last": daemon_log[-1] if daemon_log else None,
        "daemon": {
            "rss_mib_baseline": max(base_rss),
            "rss_mib_max_under_attack": max(s["rss_mib"] for s in attack_rows),
            "rss_mib_15s_after": samples[-1]["rss_mib"],
            "threads_max": max(s["threads"] for s in samples),
            "fds_max": max(s["fds"] for s in samples),
        },
        "timeline": samples,
    }
    (RESULTS / f"soak-attacks{'-' + args.tag if args.tag else ''}.json").write_text(json.dumps(res, indent=2))
    text = report(res)
    (RESULTS / f"soak-attacks{'-' + args.tag if args.tag else ''}.md").write_text(text)
    print(text)
    return 0


def report(res: dict[str, Any]) -> str:
    def row(name: str, phase: dict[str, Any]) -> str:
        s = phase[name]
        failed = ", ".join(f"{n} x {k}" for k, n in s["failed"].items()) or "none"
        if not s.get("p50_ms"):
            return f"| {name} | {s['requests']} | {s['ok']} | {failed} | | | | |"
        return (f"| {name} | {s['requests']} | {s['ok']} | {failed} | {s['p50_ms']:.1f} | {s['p90_ms']:.1f} | "
                f"{s['p99_ms']:.1f} | {s['max_ms']:.1f} |")  # fmt: skip

    d, m, c = res["daemon"], res["machine"], res["attacker_counts"]
    return "\n".join([
        f"# Soak: attacks 1-4 of issue 12 held together for {res['attack_minutes']:g} minutes",
        "",
        f"{m['date']}; {m['cpu']}, {m['cores']} cores (shared with the attacker), Python {m['python']}; "
        f"revision {res['revision']}.",
        "",
        "8 fake H100s, TLS and basic auth (bcrypt cost 10), the daemon's soft fd limit started at 1024. "
        "The attacker holds 2,000 idle sockets, 1,000 TLS keep-alive sockets, 1,000 handshake-only TLS "
        "sockets, 45 connections with 200 unread pipelined GET /metrics each, and 50 connections of wrong "
        "passwords, reconnecting 1 s after each close. The good scraper opens a fresh TLS connection with the "
        "right password once a second; the probe fetches /healthz likewise.",
        "",
        "| client | requests | 200 | failed | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|",
        "| **baseline, no attack** | | | | | | | |",
        row("scrape", res["baseline"]),
        row("probe", res["baseline"]),
        "| **under attack** | | | | | | | |",
        row("scrape", res["attack"]),
        row("probe", res["attack"]),
        "",
        f"Daemon: RSS {d['rss_mib_baseline']:.1f} MiB before, at most {d['rss_mib_max_under_attack']:.1f} MiB "
        f"under attack, {d['rss_mib_15s_after']:.1f} MiB 15 s after it stopped; at most {d['threads_max']:.0f} "
        f"threads and {d['fds_max']:.0f} open files.",
        "",
        "Attacker, over the run: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + " (connections "
        "made per kind, errors per kind, and answers to wrong passwords).",
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
