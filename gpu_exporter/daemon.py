"""Wires the poller, the snapshot readers and the HTTP server together, and applies a re-read
configuration (SIGHUP): rules, receivers and the web config change in place; every other setting
needs a restart, and the log names each one that changed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry

from .accounting.ledger import Accountant
from .accounting.pricing import PriceBook
from .alerting.delivery import OUTCOMES, AlertmanagerReceiver, Notifier, Receiver, WebhookReceiver
from .alerting.engine import RuleEngine, node_name
from .kubernetes.attribution import Attributor
from .logs import dropped_lines
from .once import holder_attributor
from .schedule import PollSchedule
from .serving.accounting_metrics import AccountingCollector
from .serving.exposition import Exposition
from .serving.metrics import AlertsCollector, RenderOptions, SelfMetrics, SnapshotCollector
from .serving.pages import pages
from .settings.config import Settings
from .snapshot import GpuReading, NodeSnapshot
from .sources.backend import Backend
from .sources.poller import Poller
from .web.server import HttpServer
from .web.watcher import WebConfigWatcher

if TYPE_CHECKING:
    from .kubernetes.kubelet import PodResourcesWatcher

log = structlog.get_logger(__name__)

RELOADABLE = frozenset({"rules", "alerting", "web_config_file"})
Attach = Callable[[tuple[GpuReading, ...]], tuple[GpuReading, ...]]


class Daemon:
    def __init__(self, settings: Settings, make_backend: Callable[[Callable[[str, str], None]], Backend]) -> None:
        self.settings = settings
        self.registry = registry = CollectorRegistry()
        self.metrics = SelfMetrics(registry, log_lines_dropped=dropped_lines)
        self.metrics.config_loaded_at.set(time.time())  # the configuration in force, as of now
        k8s = settings.kubernetes
        pod_labels = k8s.labels if k8s.enabled() else None
        self.watcher: PodResourcesWatcher | None = None
        attach: Attach | None = None
        if pod_labels is not None:
            # gRPC costs ~10 MiB of memory; load it only where pod attribution is on.
            from .kubernetes.kubelet import OUTCOMES as KUBELET_OUTCOMES
            from .kubernetes.kubelet import PodResourcesWatcher

            self.metrics.watch_kubelet(KUBELET_OUTCOMES)
            self.watcher = PodResourcesWatcher(
                k8s.pod_resources_socket, resource_names=k8s.resource_names, resource_prefixes=k8s.resource_prefixes,
                refresh_interval=k8s.refresh_interval, timeout=k8s.timeout, outcome=self.metrics.count_kubelet,
                keep_last_good_for=k8s.keep_last_good_for, expired=self.metrics.count_attribution_expired,
            )  # fmt: skip
            watcher = self.watcher
            pods = Attributor(watcher.devices, unattributed=lambda: watcher.table().unattributed)
            self.metrics.watch_unattributed(pods.unattributed)
            attach = pods.attach
        # Slurm jobs and containers, after the pods: a pod's process keeps its pod.
        self.holders = holder_attributor(settings, pod_mode=pod_labels is not None)
        if self.holders is not None:
            self.metrics.watch_holders(self.holders.errors)
            attach = _then(attach, self.holders.attach)
        jobs = self.holders is not None and self.holders.jobs
        containers = self.holders is not None and self.holders.containers
        self.collector = SnapshotCollector(
            RenderOptions(settings.process_top_n, pod_labels, settings.collectors.disabled(), jobs, containers)
        )
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
                                 resolved_retention=alerting.resolved_retention, pod_labels=pod_labels,
                                 poll_interval=settings.poll_interval, jobs=jobs, containers=containers)  # fmt: skip
        # Rules average utilization over samples kept this long; a longer window needs a restart.
        self._horizon = max(settings.rules.GpuUnderutilized.window, settings.rules.GpuIdle.window)
        self._evaluating = threading.Lock()  # a reload swaps rules and receivers between evaluations
        self.notifier = Notifier(self._receivers(settings, []))
        registry.register(AlertsCollector(self.engine.active,
                                          lambda: [(r.name, len(r)) for r in self.notifier.receivers]))  # fmt: skip
        self.exposition = Exposition(registry)
        self.poller = Poller(
            make_backend(self.metrics.count_error),
            errors=self.metrics.count_error,
            static_refresh_s=settings.static_refresh_interval,
            gpu_timeout_s=settings.gpu_timeout,
            attach=attach,
        )
        self.latest: NodeSnapshot | None = None
        self._models: dict[str, str] = {}  # GPU UUID -> model name, as last read
        self._last_success: float | None = None  # monotonic
        self.listeners: list[Callable[[NodeSnapshot], None]] = []
        # A poll waits at most gpu_timeout for each GPU (in parallel); beyond twice that and a few
        # intervals, polling itself is stuck and /healthz says so.
        stalled_after = 2 * settings.gpu_timeout + 3 * settings.poll_interval + 10
        self._schedule = PollSchedule(self._poll_job, settings.poll_interval, stalled_after=stalled_after)
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

    def _receivers(self, settings: Settings, running: list[Receiver]) -> list[Receiver]:
        """Receivers for ``settings``; those already running with the same settings are kept, queue and all."""
        alerting = settings.alerting
        # Like Prometheus: a firing alert stays valid for four resend intervals (or evaluation
        # intervals, if longer; the poll interval needs a restart); if the daemon dies, Alertmanager
        # resolves it by itself.
        valid_for = 4 * max(alerting.resend_interval, self.settings.poll_interval)
        count = self.metrics.count_notification
        out: list[Receiver] = []
        spare = list(running)
        for r in alerting.alertmanagers:
            kept = next((x for x in spare if isinstance(x, AlertmanagerReceiver) and x.settings == r), None)
            if kept is not None and alerting.queue_size == self.settings.alerting.queue_size:
                spare.remove(kept)
                kept.valid_for = valid_for  # read when each batch is sent
                out.append(kept)
            else:
                out.append(AlertmanagerReceiver(r, count, queue_size=alerting.queue_size, valid_for=valid_for,
                                                generator_url=self.alerts_url))  # fmt: skip
        for w in alerting.webhooks:
            same = next((x for x in spare if isinstance(x, WebhookReceiver) and x.settings == w), None)
            if same is not None:
                spare.remove(same)
                out.append(same)
            else:
                out.append(WebhookReceiver(w, count, generator_url=self.alerts_url))
        for x in out:
            self.metrics.watch_receiver(x.name, OUTCOMES)
        return out

    def publish(self, snapshot: NodeSnapshot) -> None:
        self.collector.snapshot = snapshot
        # Rules see the snapshot before it is rendered, so /metrics and the alerts agree.
        with self._evaluating:
            try:
                self.accountant.observe(snapshot)
            except Exception:  # the books are an extra; the metrics and alerts go on without them
                log.exception("accounting_failed")
            self.notifier.send(self.engine.evaluate(snapshot).to_send, now=snapshot.steady_at)
        self.metrics.nvml_up.set(1 if snapshot.nvml_up else 0)
        self.metrics.poll_duration.observe(snapshot.duration_seconds)
        if snapshot.nvml_up:
            self.metrics.last_success.set(snapshot.taken_at)
        self.exposition.invalidate()  # the next scrape renders this snapshot
        # Readiness follows only once /metrics serves this snapshot.
        if snapshot.nvml_up:
            self._last_success = time.monotonic()
        self.latest = snapshot
        models = {g.uuid: g.static.name for g in snapshot.gpus if g.static is not None and g.uuid}
        if any(self._models.get(uuid) != name for uuid, name in models.items()):
            self._models = {**self._models, **models}  # a new dict: the HTTP threads read the old one whole
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

    def liveness(self) -> tuple[bool, str]:
        """Alive unless polling has stalled: Kubernetes restarts a daemon whose polls stopped."""
        stalled = self._schedule.stalled()
        if stalled is not None:
            return False, f"polling has stalled: {stalled:.0f} s without a poll finishing, past its bound"
        return True, "ok"

    def gpu_models(self) -> dict[str, str]:
        """GPU UUID -> model name, as last read (for the /alerts page): a GPU lost since, or every GPU while
        NVML is down, keeps the name read while it answered (one entry per GPU the node ever had)."""
        return self._models

    def start(self) -> None:
        served = pages(self.exposition, self.readiness, self.engine.active, node=node_name(self.settings.node_name),
                       gpu_models=self.gpu_models, liveness=self.liveness, holders=self.engine.holders)  # fmt: skip
        self._http = HttpServer(self.settings.listen_address, served, web=self.web,
                                max_requests=self.settings.web_max_requests)  # fmt: skip
        self._http.start()
        self.notifier.start()
        if self.watcher is not None:
            self.watcher.start()
        self._schedule.start()
        log.info("listening", address=self.settings.listen_address, port=self._http.port,
                 poll_interval_s=self.settings.poll_interval, tls=self.web.current().tls is not None,
                 basic_auth=self.web.current().auth_required)  # fmt: skip

    def reload(self, new: Settings, now: float | None = None) -> None:
        """Apply a re-read configuration, all of it or (on WebConfigError) none of it; ``now`` (Unix time,
        default the clock's) becomes gpu_exporter_config_last_reload_success_timestamp_seconds."""
        running = self.settings
        web = self.web.read(new.web_config_file)  # fails before anything has changed
        rules, pinned = new.rules, []
        for name in ("GpuUnderutilized", "GpuIdle"):
            rule = getattr(rules, name)
            if rule.window > self._horizon:
                # The engine keeps samples for the windows it started with; a longer one would
                # silently average over less than it says.
                kept = rule.model_copy(update={"window": getattr(running.rules, name).window})
                rules = rules.model_copy(update={name: kept})
                pinned.append(f"rules.{name}.window")
        old_receivers = self.notifier.receivers
        receivers = self._receivers(new, old_receivers)
        with self._evaluating:
            self.engine.rules = rules
            self.engine.resend_interval = new.alerting.resend_interval
            # One idea of "idle" for the alert and the books, before and after the reload.
            self.accountant.threshold = rules.GpuUnderutilized.threshold
            self.accountant.signal = rules.GpuUnderutilized.signal
            self.engine.resolved_retention = new.alerting.resolved_retention
            self.notifier.receivers = receivers
        self.web.install(new.web_config_file, web)
        for r in receivers:
            if r not in old_receivers:
                r.start()
        for r in old_receivers:
            if r not in receivers:
                r.stop()  # says how many notifications it could not deliver
                if all(x.name != r.name for x in receivers):
                    self.metrics.forget_receiver(r.name, OUTCOMES)
        self.settings = running.model_copy(
            update={"rules": rules, "alerting": new.alerting, "web_config_file": new.web_config_file}
        )
        for name in type(running).model_fields:
            if name not in RELOADABLE and getattr(running, name) != getattr(new, name):
                log.warning("setting_needs_restart", setting=name, running=str(getattr(running, name)),
                            configured=str(getattr(new, name)))  # fmt: skip
        for name in pinned:
            log.warning("setting_needs_restart", setting=name, reason="longer than the windows the daemon started with")
        log.info("config_reloaded", receivers=[r.name for r in receivers], web_config_file=str(new.web_config_file),
                 tls=web.config.tls is not None, basic_auth=web.config.auth_required)  # fmt: skip
        self.metrics.config_loaded_at.set(time.time() if now is None else now)
        self.exposition.invalidate()  # scraped at once, not after the next poll

    def reload_failed(self) -> None:
        """A reload that did not happen (the file did not load, a setting was refused): counted, the
        running configuration and its load time kept."""
        self.metrics.config_reload_failures.inc()
        self.exposition.invalidate()

    @property
    def port(self) -> int:
        assert self._http is not None
        return self._http.port

    def stop(self) -> None:
        """Stops within a couple of seconds even if a poll is stuck in the driver."""
        self._schedule.stop()
        if self._http is not None:
            self._http.stop()
        self.notifier.stop()
        if self.watcher is not None:
            self.watcher.stop()
        closer = threading.Thread(target=self.poller.close, daemon=True)
        closer.start()
        closer.join(timeout=1.5)


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
