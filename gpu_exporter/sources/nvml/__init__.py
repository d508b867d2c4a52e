"""The NVML backend: the only part of the exporter that knows pynvml.

By concern: ``backend`` (NVML's session and the Backend interface), ``device`` (a GPU's handle and
how every query's answer is judged), ``errors`` (what NVML's return codes mean), ``static``
(facts read at discovery), ``reads`` (one poll of one GPU), ``fields`` (field values and the PCIe
counters), ``processes``, ``mig``, ``profiling`` (GPM through NVML), ``xid`` (the XID event
watcher) and ``bindings`` (the one place that reaches past nvidia-ml-py's public API).
"""

from .backend import NvmlBackend

__all__ = ["NvmlBackend"]
