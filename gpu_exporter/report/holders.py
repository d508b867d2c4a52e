"""Who holds a GPU, read back from the labels of a ``gpu_state_seconds_total`` series: the exporter
writes one holder per series, a pod, a Slurm job, a container or a Unix user, each with its kind's
labels (docs/holders-processes-mig.md).  The series carry no kind label, so the kind is the first
of these that a series names; the name in words is the exporter's own (``Holder.name``: what /alerts
and ``--once`` show), so one holder reads the same everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# The labels the report's queries group GPU time by (queries.HOLDER): each holder's identity.  A
# pod's container and a job's account and partition describe a holder the other labels already tell
# apart.  A container's engine does not: a container in a user's delegated cgroup is
# ``container_engine="docker@1000"`` on /metrics, never the system engine's container of the same ID
# (holders/cgroups.py), and the report keeps them two holders as the exporter does.
LABELS = ("namespace", "pod", "hpc_job", "container_engine", "container_id", "container_name", "user")


class Holder(NamedTuple):
    kind: str  # pod, job, container, user; "" for nobody
    namespace: str = ""
    pod: str = ""
    hpc_job: str = ""
    container: str = ""  # its name, else its (short) ID
    user: str = ""  # a user's, or a job's
    # What else tells containers apart (not in the name, which is the exporter's own): the engine
    # (``docker``, or ``docker@1000`` in user 1000's subtree) and the ID.
    engine: str = ""
    container_id: str = ""

    @property
    def name(self) -> str:
        """In words: ``pod ml/train``, ``job 4242 of alice``, ``container trainer``, ``user alice``."""
        if self.kind == "pod":
            return f"pod {self.namespace}/{self.pod}"
        if self.kind == "job":
            return f"job {self.hpc_job}" + (f" of {self.user}" if self.user else "")
        if self.kind == "container":
            return f"container {self.container}"
        return f"user {self.user}" if self.kind == "user" else ""


NOBODY = Holder("")


def holder_of(labels: Mapping[str, str]) -> Holder:
    """The holder a series names: its pod, else its job, else its container, else its user."""
    get = labels.get
    if pod := get("pod", ""):
        return Holder("pod", namespace=get("namespace", ""), pod=pod)
    if job := get("hpc_job", ""):
        return Holder("job", hpc_job=job, user=get("user", ""))
    if container := get("container_name", "") or get("container_id", ""):
        return Holder(
            "container", container=container, engine=get("container_engine", ""), container_id=get("container_id", "")
        )
    if user := get("user", ""):
        return Holder("user", user=user)
    return NOBODY
