"""The report names a holder from the labels the store kept (it may not import the daemon's
snapshot: tests/test_architecture.py), so its wording is a second copy of ``snapshot.Holder.name``.
This keeps the two equal: one holder reads the same in /alerts, ``--once`` and the report."""

from __future__ import annotations

import pytest

from gpu_exporter.report.holders import holder_of
from gpu_exporter.snapshot import (
    ContainerRef,
    Holder,
    JobRef,
    PodRef,
    container_holder,
    job_holder,
    pod_holder,
    user_holder,
)

HOLDERS = [
    pod_holder(PodRef("ml", "train-0", "worker")),
    job_holder(JobRef("4242", "alice", "physics", "gpu")),
    job_holder(JobRef("4243", "", "", "")),
    container_holder(ContainerRef("podman", "0123456789ab" + "0" * 52, "trainer")),
    container_holder(ContainerRef("docker", "fedcba987654" + "1" * 52, "")),
    user_holder("bob"),
]


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda h: h.name)
def test_the_report_reads_back_the_holder_the_exporter_wrote(holder: Holder) -> None:
    read = holder_of(holder.labels())  # the labels gpu_state_seconds_total carries for this holder
    assert (read.kind, read.name) == (holder.kind, holder.name)


def test_the_reports_list_of_holder_labels_is_the_exporters() -> None:
    """The report tells copies of one series apart by every holder label the exporter writes; its own
    list (it may not import the snapshot) must be exactly the declared one, or two holders would merge."""
    from gpu_exporter.report.queries import EVERY_HOLDER_LABEL
    from gpu_exporter.snapshot import HOLDER_LABELS

    declared = {label for labels in HOLDER_LABELS.values() for label in labels}
    assert sorted(EVERY_HOLDER_LABEL) == sorted(declared)
    assert len(EVERY_HOLDER_LABEL) == len(set(EVERY_HOLDER_LABEL))
