"""Which Kubernetes pod and container holds each GPU, from the kubelet's PodResources v1 API.

The kubelet serves ``List`` (gRPC) on a unix socket (by default /var/lib/kubelet/pod-resources/kubelet.sock,
mounted into the exporter's pod): every pod on the node, with the device ids that device plugins
assigned to each container.  A background thread asks every ``refresh_interval`` seconds and swaps
in a new immutable mapping, so readers (the scrape path) never wait on the kubelet; a kubelet that
hangs costs the refresh thread at most ``timeout`` per call.

A failed refresh (the kubelet restarting, its socket gone for a moment, an error or a timeout)
keeps the last good mapping: a pod leaves only when a successful ``List`` no longer shows it.  A
kubelet restart therefore changes no label of any series or alert.  Only when no refresh has
succeeded for ``keep_last_good_for`` seconds is the mapping dropped, logged once
(``pod_attribution_expired``) and counted, so labels never name pods long after the kubelet could
have said they left.

Device ids and DRA claims are read into keys the rest of the exporter can look up, as
``gpu_exporter.kubernetes.devices`` describes: NVIDIA's and GKE's device plugins, HAMi, and DRA
with NVIDIA's GPU driver.  A device that names no GPU (another DRA driver's, a name in no known
form) is logged once per reason and what it was, and counted in the last answer's table.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from types import MappingProxyType

import structlog

from ..snapshot import PodRef
from .devices import DeviceMap, DeviceTable, Unattributed, build_device_map
from .grpc_unix import RpcError, UnaryCall
from .podresources import AnswerTooLarge, WireError, decode_list_response

__all__ = ["DeviceMap", "DeviceTable", "PodRef", "PodResourcesWatcher", "build_device_map"]

log = structlog.get_logger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_KEEP_LAST_GOOD_FOR_S = 300.0
OUTCOMES = ("ok", "error", "missing")
# What the kubelet's own pod-resources client allows; the default 4 MiB could cut off a busy node.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
STOP_JOIN_S = 1.0
LIST_METHOD = "/v1.PodResourcesLister/List"

# The (reason, device) pairs already logged, bounded: a node lists tens of devices, not thousands.
MAX_LOGGED_UNATTRIBUTED = 1024
_EMPTY = DeviceTable(MappingProxyType({}))


class PodResourcesWatcher:
    """Keeps the latest device -> pod mapping from the kubelet's pod-resources socket.

    ``outcome`` is told how each refresh went: ``ok``, ``error`` (the kubelet did not answer in
    time or answered with an error) or ``missing`` (no socket: not on Kubernetes, the socket is
    not mounted, or the kubelet is restarting).  ``expired`` is called when the last good mapping
    is dropped after ``keep_last_good_for`` seconds without a successful refresh.  ``clock`` is
    monotonic seconds (tests drive it).  A watcher is started and stopped once.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        resource_names: Sequence[str] = ("nvidia.com/gpu",),
        resource_prefixes: Sequence[str] = ("nvidia.com/mig-",),
        refresh_interval: float = 10.0,
        timeout: float = 5.0,
        outcome: Callable[[str], None] = lambda o: None,
        keep_last_good_for: float = DEFAULT_KEEP_LAST_GOOD_FOR_S,
        expired: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if refresh_interval <= 0 or timeout <= 0 or keep_last_good_for <= 0:
            raise ValueError("refresh_interval, timeout and keep_last_good_for must be positive")
        self.socket_path = socket_path
        self.resource_names = frozenset(resource_names)
        self.resource_prefixes = tuple(resource_prefixes)
        self.refresh_interval = refresh_interval
        self.timeout = timeout
        self._outcome = outcome
        self.keep_last_good_for = keep_last_good_for
        self._expired = expired
        self._clock = clock
        self._table: DeviceTable = _EMPTY
        self._logged: set[Unattributed] = set()  # devices naming no GPU, already logged
        self._last_ok = False
        self._last_ok_at: float | None = None  # clock() of the last successful refresh
        # What the last refresh found ("ok", "missing" or "error:<reason>"), to log changes only.
        self._state: str | None = None
        self._outcome_failed = False
        self._cond = threading.Condition()  # guards _stopped, _started and _call
        self._stopped = False
        self._started = False
        self._call: UnaryCall | None = None  # the List call in flight, for stop() to cancel
        self._refreshing = threading.Lock()  # one List call at a time, whoever calls
        self._thread = threading.Thread(target=self._run, name="kubelet-pod-resources", daemon=True)

    # -- readers ---------------------------------------------------------------------------------

    def devices(self) -> DeviceMap:
        """The last good mapping (immutable; empty while attribution is off, before the first
        successful refresh, and after ``keep_last_good_for`` without one)."""
        return self._table.holders

    def table(self) -> DeviceTable:
        """The last good mapping with the devices of the same answer that name no GPU."""
        return self._table

    @property
    def available(self) -> bool:
        """True when the socket exists and the last call succeeded."""
        return self._last_ok and not self._socket_missing()

    def accepts(self, resource_name: str) -> bool:
        return resource_name in self.resource_names or resource_name.startswith(self.resource_prefixes)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Refresh now and then every ``refresh_interval``, on a daemon thread; never raises."""
        try:
            with self._cond:
                if self._started or self._stopped:
                    return
                self._started = True
            self._thread.start()
        except Exception:
            log.exception("pod_attribution_start_failed", socket=self.socket_path)

    def stop(self) -> None:
        """Stop refreshing; returns within about a second even if the kubelet is hanging."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            call = self._call
        if call is not None:
            call.cancel()  # ends a call in flight, so the thread is not held up by it
        if self._thread.is_alive():
            self._thread.join(STOP_JOIN_S)

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # refresh() catches everything; this is a last guard for the thread
                log.exception("pod_attribution_refresh_crashed")
            with self._cond:
                if self._cond.wait_for(lambda: self._stopped, timeout=self.refresh_interval):
                    return

    # -- one refresh -----------------------------------------------------------------------------

    def refresh(self) -> bool:
        """One ``List`` call (at most ``timeout``); swaps in the new mapping and returns True on success.

        A failure keeps the last good mapping until ``keep_last_good_for`` has passed since the last
        success; then metrics go on without pod labels rather than with labels that may name pods
        which are gone or that moved.  The next refresh tries again.
        """
        with self._refreshing:
            if self._stopped:
                return False
            try:
                return self._refresh()
            except Exception as e:  # never let a surprise escape into the caller or the thread
                self._failed(f"{type(e).__name__}: {e}", type(e).__name__, exc_info=True)
                return False

    def _refresh(self) -> bool:
        if self._socket_missing():
            self._last_ok = False
            self._expire_if_stale()
            if self._state != "missing":
                log.info(
                    "pod_attribution_off",
                    socket=self.socket_path,
                    detail=f"kubelet pod-resources socket not found at {self.socket_path}; pod attribution is off",
                )
                self._state = "missing"
            self._report("missing")
            return False
        # A connection per call: at one call per refresh_interval it costs nothing, and a kubelet
        # restart leaves no half-dead channel or reconnect backoff behind.
        call = UnaryCall(self.socket_path, LIST_METHOD, timeout=self.timeout, max_message_bytes=MAX_MESSAGE_BYTES)
        with self._cond:
            if self._stopped:
                return False
            self._call = call
        started = time.monotonic()
        try:
            # The answer is decoded within what is left of the call's time: its bytes are capped
            # by the call, its pods and fields by the decoder, the CPU by this deadline.
            answer = call.run()  # an empty ListPodResourcesRequest is zero bytes
            pods = decode_list_response(answer, deadline=started + self.timeout)
        except RpcError as e:
            if self._stopped:
                return False  # stop() cancelled the call: not the kubelet's fault
            self._failed(str(e), e.code)
            return False
        except AnswerTooLarge as e:
            self._failed(f"the kubelet's answer is refused: {e}", "RESOURCE_EXHAUSTED")
            return False
        except WireError as e:
            self._failed(f"the kubelet's answer is not a ListPodResourcesResponse: {e}", "MALFORMED")
            return False
        finally:
            with self._cond:
                self._call = None
        table = build_device_map(pods, self.accepts)
        devices = table.holders
        if self._stopped:
            return False
        self._log_unattributed(table)
        self._set(table, ok=True)
        self._last_ok_at = self._clock()
        if self._state != "ok":
            log.info(
                "pod_attribution_on",
                socket=self.socket_path,
                pods=len(pods),
                devices=len(devices),
                detail=f"kubelet pod-resources API answering at {self.socket_path}; pod attribution is on",
            )
            self._state = "ok"
        self._report("ok")
        return True

    def _failed(self, detail: str, reason: str, *, exc_info: bool = False) -> None:
        self._last_ok = False
        self._expire_if_stale()
        state = "error:" + reason
        if self._state != state:  # once per distinct reason, not once per refresh
            log.warning(
                "pod_attribution_failed",
                socket=self.socket_path,
                reason=reason,
                error=detail,
                detail=f"keeping the last good pod labels for up to {self.keep_last_good_for:g} s since the last "
                "successful refresh",
                exc_info=exc_info,
            )
            self._state = state
        self._report("error")

    def _expire_if_stale(self) -> None:
        """Drop the last good mapping once it is older than ``keep_last_good_for``; log and count it once."""
        if self._last_ok_at is None or self._clock() - self._last_ok_at < self.keep_last_good_for:
            return
        self._last_ok_at = None  # expired: nothing more to drop until the next success
        had = len(self._table.holders)
        self._set(_EMPTY, ok=False)
        log.warning(
            "pod_attribution_expired",
            socket=self.socket_path,
            devices=had,
            detail=f"no successful refresh from the kubelet for {self.keep_last_good_for:g} s; "
            "pod labels are dropped until it answers again",
        )
        try:
            self._expired()
        except Exception:
            log.exception("pod_attribution_expired_callback_failed")

    def _set(self, table: DeviceTable, *, ok: bool) -> None:
        self._table = table  # one reference swap: readers see the old or the new map, whole
        self._last_ok = ok

    def _log_unattributed(self, table: DeviceTable) -> None:
        """Each device naming no GPU once (per reason and driver, or name), not once per refresh."""
        for u in dict.fromkeys(table.unattributed):
            if u in self._logged or len(self._logged) >= MAX_LOGGED_UNATTRIBUTED:
                continue  # bounded: past it, new ones are only counted (a flood is never logged twice)
            self._logged.add(u)
            log.warning("pod_attribution_device_unattributed", reason=u.reason, device=u.what,
                        detail=_UNATTRIBUTED_WHY.get(u.reason, ""))  # fmt: skip

    def _report(self, outcome: str) -> None:
        try:
            self._outcome(outcome)
        except Exception:  # a metrics callback must not break attribution; say so once
            if not self._outcome_failed:
                log.exception("pod_attribution_outcome_callback_failed", outcome=outcome)
                self._outcome_failed = True

    def _socket_missing(self) -> bool:
        try:
            os.stat(self.socket_path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:
            return False  # there, but not ours to look at (a non-root exporter): the call says why
        return False


_UNATTRIBUTED_WHY = {
    "other_driver": "a DRA claim's device of a driver other than gpu.nvidia.com: not a GPU the exporter reads, "
    "so no GPU is given to its pod",
    "unparsed": "a device id in no form the exporter knows (NVIDIA's, GKE's or HAMi's device plugin, NVIDIA's DRA "
    "driver): it is given to no GPU, never guessed",
    "vfio": "a GPU passed through to a virtual machine: NVML on this node does not see it",
    "bad_claim": "a DRA claim without a name or namespace, or in another namespace than its pod: no kubelet answers "
    "so, and it names no one",
}
