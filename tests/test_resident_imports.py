"""What the daemon keeps imported for its whole life: nothing it does not use (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import gpu_exporter.cli, gpu_exporter.daemon
loaded = sorted({m.split(".")[0] for m in sys.modules})
try:
    import rich  # still importable by others, where installed
except ImportError:
    pass
print(json.dumps(loaded))
"""


def test_the_daemon_does_not_keep_rich_or_grpc_loaded() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(out.stdout))
    assert "structlog" in loaded and "prometheus_client" in loaded  # the probe imported the daemon
    # rich (~4 MiB) comes with structlog's console tracebacks where a test tool installed it;
    # gRPC (~10 MiB) only with pod attribution on.
    assert not loaded & {"rich", "pygments", "grpc"}, sorted(loaded & {"rich", "pygments", "grpc"})
