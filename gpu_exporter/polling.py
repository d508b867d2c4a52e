"""What polling the GPUs needs, built from the settings in one place for the daemon and ``--once``.

The backend, the holder attribution that joins each poll (pods from the kubelet, then Slurm jobs
and containers), the poller and how its snapshots become series: a setting means the same in a
one-off look as in the daemon because both are set up here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from .holders.attribution import HolderAttributor
from .holders.engines import EngineNames
from .holders.slurm import JobMappingDir, check_directory
from .serving.metrics import RenderOptions, SelfMetrics
from .snapshot import GpuReading
from .sources.backend import Backend, ErrorSink
from .sources.poller import Poller
from .sources.procfs import user_name

if TYPE_CHECKING:
    from .kubernetes.kubelet import PodResourcesWatcher
    from .settings.config import Settings

log = structlog.get_logger(__name__)

Attach = Callable[[tuple[GpuReading, ...]], tuple[GpuReading, ...]]


@dataclass(frozen=True)
class Polling:
    poller: Poller
    render: RenderOptions  # the holder labels on, the collectors off, the process cap
    holders: HolderAttributor | None  # Slurm jobs and containers; None where neither is on
    watcher: PodResourcesWatcher | None  # the kubelet's pods; None where pod attribution is off


def holder_attributor(settings: Settings, pod_mode: bool = False) -> HolderAttributor | None:
    """Slurm jobs and containers as the settings ask; None where neither is on.  A mapping
    directory that cannot serve (yet) is said once, here."""
    slurm, containers = settings.slurm, settings.containers
    on = containers.enabled(pod_mode)
    if not slurm.enabled() and not on:
        return None
    mapping = None
    if slurm.job_mapping_dir is not None:
        if (why := check_directory(slurm.job_mapping_dir)) is not None:
            log.warning("slurm_job_mapping_dir", path=slurm.job_mapping_dir, detail=why)
        mapping = JobMappingDir(slurm.job_mapping_dir, keep_last_good_for=slurm.keep_last_good_for)
    names = None
    if on:
        names = EngineNames({"docker": containers.docker_socket, "podman": containers.podman_socket},
                            timeout=containers.api_timeout, retry_after=containers.api_retry_after,
                            cache_size=containers.name_cache_size)  # fmt: skip
    return HolderAttributor(mapping=mapping, job_from_cgroup=slurm.job_from_cgroup, containers=on, names=names,
                            pod_mode=pod_mode, user_of_uid=user_name)  # fmt: skip


def _ignore(*_: object) -> None:
    pass


def build_polling(
    settings: Settings,
    make_backend: Callable[[ErrorSink], Backend],
    metrics: SelfMetrics | None = None,
    *,
    pods: bool = True,
) -> Polling:
    """The poller of ``settings``, its holders joined in: pods first where ``pods`` and the
    kubelet's attribution is on, then Slurm jobs and containers (a pod's process keeps its pod).
    ``metrics``, where given, counts NVML errors, kubelet refreshes and holder read failures, each
    series there from the start."""
    errors: ErrorSink = metrics.count_error if metrics is not None else _ignore
    k8s = settings.kubernetes
    pod_labels = k8s.labels if pods and k8s.enabled() else None
    watcher = None
    attach: Attach | None = None
    if pod_labels is not None:
        # gRPC costs ~10 MiB of memory; load it only where pod attribution is on.
        from .kubernetes.attribution import Attributor
        from .kubernetes.kubelet import OUTCOMES as KUBELET_OUTCOMES
        from .kubernetes.kubelet import PodResourcesWatcher

        if metrics is not None:
            metrics.watch_kubelet(KUBELET_OUTCOMES)
        watcher = PodResourcesWatcher(
            k8s.pod_resources_socket, resource_names=k8s.resource_names, resource_prefixes=k8s.resource_prefixes,
            refresh_interval=k8s.refresh_interval, timeout=k8s.timeout,
            outcome=metrics.count_kubelet if metrics is not None else _ignore,
            keep_last_good_for=k8s.keep_last_good_for,
            expired=metrics.count_attribution_expired if metrics is not None else _ignore,
        )  # fmt: skip
        running = watcher
        attributor = Attributor(running.devices, unattributed=lambda: running.table().unattributed)
        if metrics is not None:
            metrics.watch_unattributed(attributor.unattributed)
        attach = attributor.attach
    holders = holder_attributor(settings, pod_mode=pod_labels is not None)
    if holders is not None:
        if metrics is not None:
            metrics.watch_holders(holders.errors)
        attach = _then(attach, holders.attach)
    render = RenderOptions(settings.process_top_n, pod_labels, settings.collectors.disabled(),
                           jobs=holders is not None and holders.jobs,
                           containers=holders is not None and holders.containers)  # fmt: skip
    poller = Poller(make_backend(errors), errors=errors, static_refresh_s=settings.poll_static_refresh_interval,
                    gpu_timeout_s=settings.poll_gpu_timeout, attach=attach)  # fmt: skip
    return Polling(poller, render, holders, watcher)


def _then(first: Attach | None, second: Attach) -> Attach:
    """Pods, then jobs and containers: a failure of the one leaves the other's labels on."""
    if first is None:
        return second

    def both(gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        try:
            gpus = first(gpus)
        except Exception:  # the poller would drop both; say it and go on with the second
            log.exception("pod_attribution_failed")
        return second(gpus)

    return both
