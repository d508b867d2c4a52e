"""What the daemon keeps imported for its whole life: nothing it does not use (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_kubelet import fake_kubelet, pod

pytestmark = pytest.mark.integration

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
    # gRPC is for the tests' fake kubelet only.
    assert not loaded & {"rich", "pygments", "grpc"}, sorted(loaded & {"rich", "pygments", "grpc"})


ATTRIBUTION_PROBE = """
import json, sys
from gpu_exporter.kubernetes.kubelet import PodResourcesWatcher
w = PodResourcesWatcher(sys.argv[1])
assert w.refresh(), "the kubelet answered"
print(json.dumps({"devices": sorted(w.devices()), "loaded": sorted(sys.modules)}))
"""


def test_pod_attribution_speaks_to_the_kubelet_without_grpcio_or_protobuf(tmp_path: Path) -> None:
    """grpcio's C core and the protobuf runtime were 17 MiB of every node's exporter (issue 17)."""
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", "nvidia.com/gpu", ["GPU-a"]))]
        out = subprocess.run([sys.executable, "-c", ATTRIBUTION_PROBE, str(kubelet.socket_path)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    result = json.loads(out.stdout.splitlines()[-1])  # after structlog's line on stdout
    assert result["devices"] == ["GPU-a"]
    heavy = {m for m in result["loaded"] if m == "grpc" or m.startswith(("grpc.", "google.protobuf"))}
    assert not heavy, sorted(heavy)
