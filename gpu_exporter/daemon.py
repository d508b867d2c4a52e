"""Wires the poller, the snapshot readers and the HTTP server together."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from .accounting.ledger import Accountant
from .accounting.pricing import PriceBook
from .alerting.delivery import Notifier, Receiver
from .alerting.engine import RuleEngine, node_name
from .config import Settings
from .kubernetes.attribution import Attributor
from .serving.accounting_metrics import AccountingCollector
from .serving.exposition import Exposition
from .serving.http_server import HttpServer
from .serving.metrics import AlertsCollector, RenderOptions, SelfMetrics, SnapshotCollector
from .serving.web_config import WebConfigWatcher
from .snapshot import NodeSnapshot
from .sources.backend import Backend
from .sources.poller import Poller

if TYPE_CHECKING:
    from .kubernetes.kubelet import PodResourcesWatcher

log = structlog.get_logger(__name__)


class Daemon:
    def __init__(self, settings: Settings, make_backend: Callable[[Callable[[str, str], None]], Backend]) -> None:
        self.settings = settings
        self.registry = registry = CollectorRegistry()
        self.metrics = SelfMetrics(registry)
        k8s = settings.kubernetes
        pod_labels = k8s.labels if k8s.enabled() else None
        self.watcher: PodResourcesWatcher | None = None
        attach = None
        if pod_labels is not None:
            # gRPC costs ~10 MiB of memory; load it only where pod attribution is on.
            from .kubernetes.kubelet import PodResourcesWatcher

            self.watcher = PodResourcesWatcher(
                k8s.pod_resources_socket, resource_names=k8s.resource_names, resource_prefixes=k8s.resource_prefixes,
                refresh_interval=k8s.refresh_interval, timeout=k8s.timeout, outcome=self.metrics.count_kubelet,
            )  # fmt: skip
            attach = Attributor(self.watcher.devices).attach
        self.collector = SnapshotCollector(RenderOptions(settings.process_top_n, pod_labels))
        registry.register(self.collector)
        idle = settings.rules.GpuUnderutilized  # one idea of "idle" for the alert and the books
        acc = settings.accounting
        self.accountant = Accountant(
            threshold=idle.threshold, signal=idle.signal, pod_mode=pod_labels is not None,
            prices=PriceBook(settings.pricing) if settings.pricing else None,
            memory_peak_window=acc.memory_peak_window, max_users=acc.max_users,
            holder_retention=acc.holder_retention, max_step=max(60.0, 10 * settings.poll_interval),
        )  # fmt: skip
        registry.register(AccountingCollector(self.accountant.view, self.collector.opts))
        alerting = settings.alerting
        self.engine = RuleEngine(settings.rules, node_name(settings.node_name),
                                 resend_interval=alerting.resend_interval,
                                 resolved_retention=alerting.resolved_retention, pod_labels=pod_labels)  # fmt: skip
        receivers = [Receiver(r, "alertmanager", alerting.queue_size, self.metrics.count_notification)
                     for r in alerting.alertmanagers]  # fmt: skip
        receivers += [Receiver(r, "webhook", alerting.queue_size, self.metrics.count_notification)
                      for r in alerting.webhooks]  # fmt: skip
        self.notifier = Notifier(receivers, resend_interval=alerting.resend_interval, generator_url=self.alerts_url)
        registry.register(AlertsCollector(self.engine.active, lambda: [(r.name, len(r)) for r in receivers]))
        self.exposition = Exposition(registry)
        self.poller = Poller(
            make_backend(self.metrics.count_error),
            errors=self.metrics.count_error,
            static_refresh_s=settings.static_refresh_interval,
            gpu_timeout_s=settings.gpu_timeout,
            attach=attach,
        )
        self.latest: NodeSnapshot | None = None
        self._last_success: float | None = None  # monotonic
        self.listeners: list[Callable[[NodeSnapshot], None]] = []
        self._scheduler = BackgroundScheduler(timezone="UTC")
        self._http: HttpServer | None = None
        self.exposition.invalidate()  # self-metrics are served even before the first poll ends
        # Loaded now, so that a broken web config stops the start (exit 2) before anything runs.
        self.web = WebConfigWatcher(settings.web_config_file)

    def poll_once(self) -> NodeSnapshot:
        snapshot = self.poller.poll()
        self.publish(snapshot)
        return snapshot

    def _poll_job(self) -> None:
        try:
            self.poll_once()
        except Exception:  # the scheduler would swallow it; say so and poll again next time
            log.exception("poll_failed")

    def alerts_url(self) -> str:
        base = self.settings.alerting.external_url
        if not base:
            port = self._http.port if self._http is not None else 0
            base = f"http://{self.engine.node}:{port}"
        return base.rstrip("/") + "/alerts"

    def publish(self, snapshot: NodeSnapshot) -> None:
        self.collector.snapshot = snapshot
        try:
            self.accountant.observe(snapshot)
        except Exception:  # the books are an extra; the metrics and alerts go on without them
            log.exception("accounting_failed")
        # Rules see the snapshot before it is rendered, so /metrics and the alerts agree.
        self.notifier.send(self.engine.evaluate(snapshot).to_send, now=snapshot.taken_at)
        self.metrics.nvml_up.set(1 if snapshot.nvml_up else 0)
        self.metrics.poll_duration.observe(snapshot.duration_seconds)
        if snapshot.nvml_up:
            self.metrics.last_success.set(snapshot.taken_at)
        self.exposition.invalidate()  # the next scrape renders this snapshot
        # Readiness follows only once /metrics serves this snapshot.
        if snapshot.nvml_up:
            self._last_success = time.monotonic()
        self.latest = snapshot
        for listener in self.listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("snapshot_listener_failed")

    def readiness(self) -> tuple[bool, str]:
        snap = self.latest
        if snap is None:
            return False, "not ready: the first poll has not finished"
        if not snap.nvml_up:
            return False, f"not ready: NVML is unavailable: {snap.nvml_error}"
        stale_after = max(3 * self.settings.poll_interval, 10.0)
        age = time.monotonic() - self._last_success if self._last_success is not None else float("inf")
        if age > stale_after:
            return False, f"not ready: the last successful poll was {age:.0f} s ago (limit {stale_after:g} s)"
        return True, f"ready: {len(snap.gpus)} GPUs, last poll {age:.1f} s ago"

    def start(self) -> None:
        self._http = HttpServer(self.settings.listen_address, self.exposition, self.readiness, self.engine.active,
                                web=self.web, max_requests=self.settings.web_max_requests)  # fmt: skip
        self._http.start()
        self.notifier.start()
        if self.watcher is not None:
            self.watcher.start()
        self._scheduler.add_job(
            self._poll_job,
            "interval",
            seconds=self.settings.poll_interval,
            coalesce=True,
            max_instances=1,
            next_run_time=datetime.now(),
            id="poll",
        )
        self._scheduler.start()
        log.info("listening", address=self.settings.listen_address, port=self._http.port,
                 poll_interval_s=self.settings.poll_interval, tls=self.web.current().ssl_context is not None,
                 basic_auth=self.web.current().auth_required)  # fmt: skip

    @property
    def port(self) -> int:
        assert self._http is not None
        return self._http.port

    def stop(self) -> None:
        """Stops within a couple of seconds even if a poll is stuck in the driver."""
        self._scheduler.shutdown(wait=False)
        if self._http is not None:
            self._http.stop()
        self.notifier.stop()
        if self.watcher is not None:
            self.watcher.stop()
        closer = threading.Thread(target=self.poller.close, daemon=True)
        closer.start()
        closer.join(timeout=1.5)
