"""Pod label values, shared by the metrics and the alerts."""

from __future__ import annotations

from collections.abc import Iterable

from .snapshot import PodRef


def pod_label_values(pods: Iterable[PodRef]) -> tuple[str, str, str]:
    """One container: its namespace, pod and container.  Several (time-slicing): each joined with
    commas, in a stable order; ``gpu_pod_info`` lists them one by one for exact joins."""
    refs = sorted(set(pods), key=lambda r: (r.namespace, r.pod, r.container))
    return (
        ",".join(dict.fromkeys(r.namespace for r in refs)),
        ",".join(dict.fromkeys(r.pod for r in refs)),
        ",".join(dict.fromkeys(r.container for r in refs)),
    )
