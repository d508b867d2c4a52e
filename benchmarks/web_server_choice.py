"""Why the web server is ours: three ready-made servers against the clients that broke them.

Each server runs in a process of its own on loopback, and this script is the client:

1. **prometheus_client with TLS** (``start_http_server(certfile=..., keyfile=...)``, what a Python
   exporter gets from the client library): one client opens a TCP connection and sends nothing;
   meanwhile a scraper tries ``GET /metrics`` over TLS, 5 times, 5 s each.  Then the idle client
   goes away and the scraper tries once more.
2. **prometheus_client without TLS**: ``--half-sent`` clients (200) each send a request head
   without its final empty line, and hold; the server's threads are counted after 1 s and after
   ``--hold`` seconds, and a scraper is timed meanwhile.
3. **uvicorn** (h11, its own default for a pure-Python install): a client that sends nothing and
   one that sends half a request head, held ``--hold`` seconds; are they still open?  The half-sent
   request is then finished and answered.  Then the same ``limit_concurrency`` as our 40 request
   slots, 40 half-sent requests, and a scraper.
4. **gpu-exporter** (``--simulate``), the same clients: TLS with a silent client, and half-sent
   requests (how long until the server closes them, and its threads).

uvicorn is not a dependency of the project: give the Python of a throwaway virtualenv that has it,

    python3 -m venv /tmp/uvenv && /tmp/uvenv/bin/pip install uvicorn
    .venv/bin/python benchmarks/web_server_choice.py --uvicorn-python /tmp/uvenv/bin/python

(~3 minutes with the default ``--hold 35``).  Without it the uvicorn case is left out and says so.
Writes benchmarks/results/web-server-choice.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HALF = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: half-sent\r\n"  # no empty line: the head never ends
SCRAPE_TIMEOUT_S = 5.0

PROMETHEUS_CLIENT = """
import sys, time
from prometheus_client import start_http_server
tls = dict(certfile=sys.argv[1], keyfile=sys.argv[2]) if len(sys.argv) > 2 else {}
server, _ = start_http_server(0, addr="127.0.0.1", **tls)
print(server.server_port, flush=True)
time.sleep(3600)
"""

UVICORN = """
import socket, sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"up 1\\n"})
limit = int(sys.argv[1]) or None
sock = socket.create_server(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
config = uvicorn.Config(app, http="h11", log_level="error", limit_concurrency=limit, lifespan="off")
uvicorn.Server(config).run(sockets=[sock])
"""


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError("no Threads line")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


@contextlib.contextmanager
def server(cmd: list[str], port_from: str = "stdout") -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Start a server process and wait for the port it prints (or logs, for gpu-exporter)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stream = proc.stdout if port_from == "stdout" else proc.stderr
        assert stream is not None
        port = 0
        while not port:
            line = stream.readline()
            if not line:
                raise SystemExit(f"{cmd[:3]} exited: {proc.stderr.read() if proc.stderr else ''}")
            if port_from == "stdout":
                port = int(line)
            else:
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    port = int(entry["port"]) if entry.get("event") == "listening" else 0
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def scrape(port: int, ctx: ssl.SSLContext | None = None, timeout: float = SCRAPE_TIMEOUT_S) -> tuple[str, float]:
    """GET /metrics on a fresh connection: ("200", seconds), or ("timeout"/an error, seconds)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            s = ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx else raw
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else f"no answer ({len(data)} B)"
    except TimeoutError:
        status = "timeout"
    except (OSError, ssl.SSLError) as e:
        status = type(e).__name__
    return status, time.monotonic() - t0


def half_sent(port: int, n: int) -> list[socket.socket]:
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(HALF)
        held.append(s)
    return held


def is_open(s: socket.socket) -> bool:
    """Not closed by the server (no EOF, no reset, nothing sent): peeks without blocking."""
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def wait_closed(socks: list[socket.socket], limit_s: float, t0: float) -> list[float | None]:
    """Seconds from ``t0`` until the server closed each socket (None: still open ``limit_s`` after ``t0``)."""
    closed: list[float | None] = [None] * len(socks)
    while time.monotonic() - t0 < limit_s and None in closed:
        for i, s in enumerate(socks):
            if closed[i] is None and not is_open(s):
                closed[i] = time.monotonic() - t0
        time.sleep(0.05)
    return closed


def tls_files(tmp: Path) -> tuple[Path, Path, ssl.SSLContext, Path]:
    import trustme
    import yaml

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    web = tmp / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}))
    return tmp / "tls.crt", tmp / "tls.key", ctx, web


def silent_client_vs_tls(port: int, ctx: ssl.SSLContext, tries: int = 5) -> dict[str, Any]:
    """One client connects and sends nothing; a scraper tries ``tries`` times; then the client leaves."""
    assert scrape(port, ctx)[0] == "200", "the server does not answer to begin with"
    idle = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.2)
    during = [scrape(port, ctx) for _ in range(tries)]
    idle.close()
    after = scrape(port, ctx)
    return {"answered_during": sum(s == "200" for s, _ in during), "tries": tries,
            "during": [s for s, _ in during], "after_status": after[0], "after_s": round(after[1], 3)}  # fmt: skip


def half_sent_threads(pid: int, port: int, n: int, hold_s: float, ctx: ssl.SSLContext | None = None) -> dict[str, Any]:
    before = threads(pid)
    rss_before = rss_mib(pid)
    t0 = time.monotonic()
    held = half_sent(port, n)
    time.sleep(1)
    at_1s = threads(pid)
    rss_1s = rss_mib(pid)
    status, took = scrape(port, ctx)
    closed = wait_closed(held, hold_s, t0)
    still_open = sum(c is None for c in closed)
    at_hold = threads(pid)
    for s in held:
        s.close()
    times = sorted(c for c in closed if c is not None)
    return {"clients": n, "threads_before": before, "threads_at_1s": at_1s, "threads_at_hold": at_hold,
            "rss_before_mib": round(rss_before, 1), "rss_at_1s_mib": round(rss_1s, 1),
            "scrape_status": status, "scrape_s": round(took, 3), "hold_s": hold_s,
            "still_open_at_hold": still_open,
            "closed_after_s": [round(times[0], 1), round(times[-1], 1)] if times else None}  # fmt: skip


def uvicorn_case(python: str, hold_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with server([python, "-c", UVICORN, "0"]) as (proc, port):
        version = subprocess.run([python, "-c", "import uvicorn, h11; print(uvicorn.__version__, h11.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        out["uvicorn"], out["h11"] = version
        assert scrape(port)[0] == "200"
        silent = socket.create_connection(("127.0.0.1", port))
        half = half_sent(port, 1)[0]
        time.sleep(hold_s)
        out["hold_s"] = hold_s
        out["silent_open_at_hold"] = is_open(silent)
        out["half_sent_open_at_hold"] = is_open(half)
        half.sendall(b"\r\n")
        half.settimeout(5)
        answer = half.recv(65536)
        out["half_sent_then_finished"] = answer.split(b"\r\n", 1)[0].decode()
        silent.close()
        half.close()
    with server([python, "-c", UVICORN, "40"]) as (proc, port):
        held = half_sent(port, 40)
        time.sleep(0.5)
        results = [scrape(port)[0] for _ in range(5)]
        out["limit_concurrency"] = 40
        out["scrapes_with_40_half_sent"] = results
        out["threads_with_40_half_sent"] = threads(proc.pid)
        for s in held:
            s.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uvicorn-python", metavar="PYTHON", help="a Python that can import uvicorn")
    ap.add_argument("--hold", type=float, default=35.0, help="seconds the half-sent clients hold (default 35)")
    ap.add_argument("--half-sent", type=int, default=200, help="half-sent requests against the threaded servers")
    args = ap.parse_args()
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.release()}",
        "revision": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                   text=True).stdout.strip(),
    }  # fmt: skip
    import prometheus_client

    res["prometheus_client"] = prometheus_client.__version__ if hasattr(prometheus_client, "__version__") else ""
    if not res["prometheus_client"]:
        from importlib.metadata import version

        res["prometheus_client"] = version("prometheus_client")
    with tempfile.TemporaryDirectory() as tmp_name:
        cert, key, ctx, web = tls_files(Path(tmp_name))
        with server([sys.executable, "-c", PROMETHEUS_CLIENT, str(cert), str(key)]) as (proc, port):
            res["prometheus_client_tls"] = silent_client_vs_tls(port, ctx)
        with server([sys.executable, "-c", PROMETHEUS_CLIENT]) as (proc, port):
            res["prometheus_client_half_sent"] = half_sent_threads(proc.pid, port, args.half_sent, args.hold)
        daemon = [sys.executable, "-m", "gpu_exporter", "--simulate", "--web.listen-address", "127.0.0.1:0",
                  "--log.format", "json"]  # fmt: skip
        with server([*daemon, "--web.config.file", str(web)], port_from="stderr") as (proc, port):
            res["ours_tls"] = silent_client_vs_tls(port, ctx)
        with server(daemon, port_from="stderr") as (proc, port):
            res["ours_half_sent"] = half_sent_threads(proc.pid, port, args.half_sent, args.hold)
    python = args.uvicorn_python
    if python is None and importlib.util.find_spec("uvicorn") is not None:
        python = sys.executable
    res["uvicorn_case"] = uvicorn_case(python, args.hold) if python else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "web-server-choice.json").write_text(json.dumps(res, indent=2) + "\n")
    text = report(res)
    (RESULTS / "web-server-choice.md").write_text(text)
    print(text)
    return 0


def report(r: dict[str, Any]) -> str:
    pt, ph = r["prometheus_client_tls"], r["prometheus_client_half_sent"]
    ot, oh = r["ours_tls"], r["ours_half_sent"]
    u = r["uvicorn_case"]
    lines = [
        "# Why the web server is ours",
        "",
        f"{r['date']}, {r['machine']}; this tree is {r['revision']}; prometheus_client {r['prometheus_client']}. "
        "`benchmarks/web_server_choice.py`: each server in its own process on loopback; scrapes on fresh "
        f"connections with a {SCRAPE_TIMEOUT_S:.0f} s timeout.",
        "",
        "| server | client | result |",
        "|---|---|---|",
        f"| prometheus_client, TLS | 1 TCP connection that sends nothing | {pt['answered_during']} of {pt['tries']} "
        f"scrapes answered ({', '.join(sorted(set(pt['during'])))}); once it left: {pt['after_status']} in "
        f"{pt['after_s']} s |",
        f"| prometheus_client, no TLS | {ph['clients']} half-sent request heads | threads {ph['threads_before']} "
        f"before, {ph['threads_at_1s']} after 1 s, {ph['threads_at_hold']} after {ph['hold_s']:.0f} s "
        f"({ph['still_open_at_hold']} still open); RSS {ph['rss_before_mib']} to {ph['rss_at_1s_mib']} MiB; "
        f"a scrape meanwhile: {ph['scrape_status']} in {ph['scrape_s']} s |",
    ]
    if u:
        lines += [
            f"| uvicorn {u['uvicorn']} (h11 {u['h11']}) | 1 connection that sends nothing, 1 half-sent request "
            f"head | after {u['hold_s']:.0f} s: silent one {'open' if u['silent_open_at_hold'] else 'closed'}, "
            f"half-sent one {'open' if u['half_sent_open_at_hold'] else 'closed'}; the head finished then: "
            f"`{u['half_sent_then_finished']}` |",
            f"| uvicorn, `limit_concurrency={u['limit_concurrency']}` | {u['limit_concurrency']} half-sent request "
            f"heads | scrapes: {', '.join(u['scrapes_with_40_half_sent'])} |",
        ]
    else:
        lines.append("| uvicorn | | not measured: no Python with uvicorn (`--uvicorn-python`) |")
    closed = oh["closed_after_s"]
    lines += [
        f"| gpu-exporter, TLS | 1 TCP connection that sends nothing | {ot['answered_during']} of {ot['tries']} "
        f"scrapes answered; once it left: {ot['after_status']} in {ot['after_s']} s |",
        f"| gpu-exporter, no TLS | {oh['clients']} half-sent request heads | threads {oh['threads_before']} before, "
        f"{oh['threads_at_1s']} after 1 s, {oh['threads_at_hold']} after {oh['hold_s']:.0f} s; closed by the server "
        f"{closed[0] if closed else '-'} to {closed[-1] if closed else '-'} s after they connected "
        f"({oh['still_open_at_hold']} still open after {oh['hold_s']:.0f} s); a scrape meanwhile: "
        f"{oh['scrape_status']} in {oh['scrape_s']} s |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
