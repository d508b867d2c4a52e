"""Wires the poller, the snapshot readers and the HTTP server together, and applies a re-read
configuration (SIGHUP): rules, receivers, prices and the web config change in place; every other
setting needs a restart, and the log names each one that changed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry

from .accounting.ledger import Accountant
from .accounting.pricing import PriceBook
from .alerting.delivery import OUTCOMES, Notifier, ReceiverHooks
from .alerting.engine import RuleEngine, node_name
from .logs import dropped_lines
from .polling import build_polling
from .serving.accounting_metrics import AccountingCollector
from .serving.exposition import Exposition
from .serving.metrics import AlertsCollector, SelfMetrics, SnapshotCollector
from .serving.pages import pages
from .settings.config import SETTING_KEYS, Settings
from .snapshot import NodeSnapshot
from .sources.backend import Backend, ErrorSink
from .sources.changes import GpuChanges
from .sources.schedule import PollSchedule
from .web.server import HttpServer
from .web.watcher import WebConfigWatcher, in_thread

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

RELOADABLE = frozenset({"rules", "alerting", "web_config_file", "pricing"})


class Daemon:
    def __init__(self, settings: Settings, make_backend: Callable[[ErrorSink], Backend]) -> None:
        self.settings = settings
        self.registry = registry = CollectorRegistry()
        self.metrics = SelfMetrics(registry, log_lines_dropped=dropped_lines)
        self.metrics.config_loaded_at.set(time.time())  # the configuration in force, as of now
        polling = build_polling(settings, make_backend, self.metrics)
        self.poller, self.holders, self.watcher = polling.poller, polling.holders, polling.watcher
        render = polling.render
        self.collector = SnapshotCollector(render)
        registry.register(self.collector)
        idle = settings.rules.GpuUnderutilized  # one idea of "idle" for the alert and the books
        acc = settings.accounting
        pod_mode = render.pod_labels is not None
        self.accountant = Accountant(
            threshold=idle.threshold, signal=idle.signal, pod_mode=pod_mode,
            prices=PriceBook(settings.pricing) if settings.pricing else None,
            memory_peak_window=acc.memory_peak_window, max_users=acc.max_users,
            holder_retention=acc.holder_retention, max_step=max(60.0, 10 * settings.poll_interval),
        )  # fmt: skip
        registry.register(AccountingCollector(self.accountant.view, render))
        alerting = settings.alerting
        self.engine = RuleEngine(settings.rules, node_name(settings.node_name),
                                 resend_interval=alerting.resend_interval,
                                 resolved_retention=alerting.resolved_retention, pod_labels=render.pod_labels,
                                 poll_interval=settings.poll_interval, jobs=render.jobs,
                                 containers=render.containers)  # fmt: skip
        self._evaluating = threading.Lock()  # a reload swaps the rules between evaluations
        hooks = ReceiverHooks(self.metrics.count_notification, self.alerts_url,
                              watch=lambda name: self.metrics.watch_receiver(name, OUTCOMES),
                              forget=lambda name: self.metrics.forget_receiver(name, OUTCOMES))  # fmt: skip
        self.notifier = Notifier.for_settings(alerting, hooks, settings.poll_interval)
        registry.register(AlertsCollector(self.engine.active,
                                          lambda: [(r.name, len(r)) for r in self.notifier.receivers]))  # fmt: skip
        self.exposition = Exposition(registry)
        self.latest: NodeSnapshot | None = None
        self.changes = GpuChanges()  # a GPU lost, back, to be reset, or with an XID: one warning each
        self._models: dict[str, str] = {}  # GPU UUID -> model name, as last read
        self._last_success: float | None = None  # monotonic
        # A poll waits at most poll_gpu_timeout for each GPU (in parallel); beyond twice that and a few
        # intervals, polling itself is stuck and /healthz says so.
        stalled_after = 2 * settings.poll_gpu_timeout + 3 * settings.poll_interval + 10
        self._schedule = PollSchedule(self._poll_job, settings.poll_interval, stalled_after=stalled_after)
        self._http: HttpServer | None = None
        self.exposition.invalidate()  # self-metrics are served even before the first poll ends
        # Loaded now, so that a broken web config stops the start (exit 2) before anything runs.
        self.web = WebConfigWatcher(settings.web_config_file, run=in_thread)

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
            self.changes.observe(snapshot)
        except Exception:  # the log is an extra; the metrics and alerts go on without it
            log.exception("gpu_changes_failed")
        # Rules see the snapshot before it is rendered, so /metrics and the alerts agree.
        with self._evaluating:
            try:
                self.accountant.observe(snapshot)
            except Exception:  # the books are an extra; the metrics and alerts go on without them
                log.exception("accounting_failed")
            self.notifier.send(self.engine.evaluate(snapshot).to_send, now=snapshot.steady_at)
        self.metrics.nvml_up.set(1 if snapshot.nvml_up else 0)
        self.metrics.nvml_released.set(1 if snapshot.nvml_released else 0)
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
        self._http = HttpServer(self.settings.web_listen_address, served, web=self.web,
                                max_requests=self.settings.web_max_requests)  # fmt: skip
        self._http.start()
        self.notifier.start()
        if self.watcher is not None:
            self.watcher.start()
        self._schedule.start()
        log.info("listening", address=self.settings.web_listen_address, port=self._http.port,
                 poll_interval_s=self.settings.poll_interval, tls=self.web.current().tls is not None,
                 basic_auth=self.web.current().auth_required)  # fmt: skip

    def reload(self, new: Settings, now: float | None = None) -> None:
        """Apply a re-read configuration, all of it or (on WebConfigError) none of it; ``now`` (Unix time,
        default the clock's) becomes gpu_exporter_config_last_reload_success_timestamp_seconds.  Each
        part takes its own settings: the receivers, the rules, the books' idea of idle, the web config."""
        running = self.settings
        web = self.web.read(new.web_config_file)  # fails before anything has changed
        receivers = self.notifier.apply(new.alerting)
        with self._evaluating:
            pinned = self.engine.apply(new.rules, resend_interval=new.alerting.resend_interval,
                                       resolved_retention=new.alerting.resolved_retention)  # fmt: skip
            # One idea of "idle" for the alert and the books, before and after the reload.
            idle = self.engine.rules.GpuUnderutilized
            self.accountant.retune(idle.threshold, idle.signal)
            # A new price holds from the reload on: gpu_price_per_hour is the price now, and the report
            # prices each step by the price the store saw then, so the hours before keep the old one.
            self.accountant.reprice(PriceBook(new.pricing) if new.pricing else None)
        self.web.install(new.web_config_file, web)
        self.settings = running.model_copy(
            update={
                "rules": self.engine.rules,
                "alerting": new.alerting,
                "web_config_file": new.web_config_file,
                "pricing": new.pricing,
            }
        )
        keys = {name: key for key, name in SETTING_KEYS.items()}  # named as the user writes it
        for name in type(running).model_fields:
            if name not in RELOADABLE and getattr(running, name) != getattr(new, name):
                log.warning("setting_needs_restart", setting=keys.get(name, name), running=str(getattr(running, name)),
                            configured=str(getattr(new, name)))  # fmt: skip
        for name in pinned:
            log.warning("setting_needs_restart", setting=name, reason="longer than the windows the daemon started with")
        log.info("config_reloaded", receivers=[r.name for r in receivers], web_config_file=str(new.web_config_file),
                 tls=web.config.tls is not None, basic_auth=web.config.auth_required)  # fmt: skip
        self.metrics.config_loaded_at.set(time.time() if now is None else now)
        self.exposition.invalidate()  # scraped at once, not after the next poll

    def release_nvml(self) -> None:
        """SIGUSR1: let go of NVML for ``poll_release_for`` (a GPU reset, a driver upgrade)."""
        self.poller.release(self.settings.poll_release_for)

    def resume_nvml(self) -> None:
        """SIGUSR2: take NVML again at the next poll."""
        self.poller.resume()

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
        if self.holders is not None:
            self.holders.close()  # the engine-name worker: it asks nothing more
        closer = threading.Thread(target=self.poller.close, daemon=True)
        closer.start()
        closer.join(timeout=1.5)
