"""The daemon's books: for each GPU, the seconds spent in each state by each holder, its memory
peak, when it was last busy and what it costs.

Each snapshot adds the time since the previous one to exactly one state of every GPU the books
know (of each GPU instance of a card in MIG mode, at its share of the card: :func:`~.states.parts`),
split between the GPU's holders (:func:`~.states.holders`: pods, Slurm jobs, containers or
users).  A GPU missing from a snapshot, or every GPU while NVML is down, adds that time to ``down``.
The sums only grow while the daemon runs, so ``increase()`` over any range is exact to a poll
interval however the scrapes fall.

A gap between two snapshots longer than ``max_step`` seconds (the daemon was stopped or the machine
suspended) is not counted: nobody saw what the GPUs did then.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..snapshot import POD, ContainerRef, GpuReading, JobRef, NodeSnapshot, PodRef
from .peaks import WindowMax
from .pricing import PriceBook
from .states import (
    BUSY,
    DOWN,
    IDLE,
    NOBODY,
    OTHERS,
    WHOLE,
    Holder,
    card_state,
    containers_of,
    jobs_of,
    parts,
    pods_of,
)

GpuKey = tuple[int, str]  # NVML index and UUID
Account = tuple[Holder, str, str]  # holder, state, GPU instance (WHOLE for the whole GPU)


@dataclass(frozen=True)
class GpuAccount:
    """One GPU's books at one moment, for rendering."""

    index: int
    uuid: str
    state: str
    pods: tuple[PodRef, ...]  # who holds it now, for the holder labels of its per-GPU series
    seconds: tuple[tuple[Holder, str, float], ...]  # (holder, state, seconds), in a stable order
    last_active: float | None = None  # unix time it was last busy; None: not since the daemon started
    memory_peak_bytes: float | None = None
    price_per_hour: float | None = None
    energy_price_per_kwh: float | None = None
    jobs: tuple[JobRef, ...] = ()  # as pods
    containers: tuple[ContainerRef, ...] = ()
    # A card in MIG mode: (GPU instance id, holder, state, seconds at its share of the card) of each
    # GPU instance; ``seconds`` then holds the time of the slices no instance takes, and the card's down.
    instance_seconds: tuple[tuple[str, Holder, str, float], ...] = ()


@dataclass(frozen=True)
class AccountingView:
    currency: str | None
    gpus: tuple[GpuAccount, ...]


@dataclass
class _Book:
    index: int
    uuid: str
    peak: WindowMax
    state: str = DOWN
    name: str | None = None
    pods: tuple[PodRef, ...] = ()
    jobs: tuple[JobRef, ...] = ()
    containers: tuple[ContainerRef, ...] = ()
    last_active: float | None = None
    seconds: dict[Account, float] = field(default_factory=dict)
    held_at: dict[Holder, float] = field(default_factory=dict)  # holder -> when it last held the GPU

    def __post_init__(self) -> None:
        # The unheld idle and down series exist from the start, so increase() sees every second of
        # them. The others appear when first used: increase() extrapolates a new counter back to
        # zero, and a GPU's two series that nearly never move (busy or allocated_idle and held by
        # nobody) cost no series until they do.
        for state in (IDLE, DOWN):
            self.seconds[(NOBODY, state, WHOLE)] = 0.0


class Accountant:
    def __init__(
        self,
        *,
        threshold: float,
        signal: str = "auto",
        pod_mode: bool = False,
        prices: PriceBook | None = None,
        memory_peak_window: float = 300.0,
        max_users: int = 20,
        holder_retention: float = 3600.0,
        max_step: float = 300.0,
    ) -> None:
        self.threshold = threshold
        self.signal = signal
        self.pod_mode = pod_mode
        self.prices = prices
        self.memory_peak_window = memory_peak_window
        self.max_users = max_users
        self.holder_retention = holder_retention
        self.max_step = max_step
        self._books: dict[GpuKey, _Book] = {}
        self._last_t: float | None = None
        self._lock = threading.Lock()
        self._view = AccountingView(None, ())  # before the first snapshot: no GPU, so nothing priced

    def retune(self, threshold: float, signal: str) -> None:
        """A re-read idle threshold and signal, from the next snapshot on (time already booked stays)."""
        with self._lock:
            self.threshold, self.signal = threshold, signal

    def reprice(self, prices: PriceBook | None) -> None:
        """Re-read prices, in force from now: the view is rendered again at once, so /metrics shows
        them before the next poll (the time booked is seconds, never money: nothing booked changes)."""
        with self._lock:
            self.prices = prices
            if self._last_t is not None:
                self._view = self._render(self._last_t)

    def observe(self, snapshot: NodeSnapshot) -> None:
        """Add the time since the previous snapshot to each GPU's state now.

        Steps, retention and memory-peak windows are measured on the steady clock (a wall-clock
        step would add hours or take them back); ``last_active`` is the wall clock, as it is shown.
        """
        t = snapshot.steady_at
        with self._lock:
            step = 0.0 if self._last_t is None else t - self._last_t
            step = step if 0 < step <= self.max_step else 0.0
            if self._last_t is None or t > self._last_t:
                self._last_t = t
            seen: set[GpuKey] = set()
            for g in snapshot.gpus if snapshot.nvml_up else ():
                key = (g.index, g.uuid)
                seen.add(key)
                book = self._books.get(key)
                if book is None:
                    book = self._books[key] = _Book(g.index, g.uuid, WindowMax(self.memory_peak_window))
                self._observe_gpu(book, g, t, step, snapshot.taken_at)
            moved = {g.uuid for g in snapshot.gpus if g.uuid} if snapshot.nvml_up else set()
            for key, book in list(self._books.items()):
                if key in seen:
                    continue
                if key[1] in moved:
                    # The same GPU under another index (the driver numbered its GPUs afresh after a
                    # reload): its time is booked there from now on, not also here as down.
                    del self._books[key]
                    continue
                # Lost from the count, or NVML is down: nobody can use it.
                book.state, book.pods, book.jobs, book.containers = DOWN, (), (), ()
                book.seconds[(NOBODY, DOWN, WHOLE)] += step
            self._view = self._render(t)

    def _observe_gpu(self, book: _Book, g: GpuReading, t: float, step: float, wall: float) -> None:
        cut = parts(g, self.threshold, self.signal, self.pod_mode)
        state = card_state(cut)
        book.state = state
        book.pods = pods_of(g) if g.up else ()
        book.jobs = jobs_of(g) if g.up else ()
        book.containers = containers_of(g) if g.up else ()
        if g.static is not None:
            book.name = g.static.name
        if state == BUSY:
            book.last_active = wall
        if g.memory_used_bytes is not None:
            book.peak.add(t, float(g.memory_used_bytes))
        self._forget(book, t)
        holding = {h for p in cut for h, _ in p.holders}
        for part in cut:
            for holder, share in self._bounded(book, part.holders, holding):
                book.held_at[holder] = t
                key = (holder, part.state, part.instance)
                book.seconds[key] = book.seconds.get(key, 0.0) + step * part.share * share

    def _bounded(self, book: _Book, shares: list[tuple[Holder, float]],
                 holding: set[Holder]) -> list[tuple[Holder, float]]:  # fmt: skip
        """Holders beyond ``max_users`` of one GPU (users, jobs and containers; pods are bounded by the
        kubelet) are counted as one 'other' of their kind, so the series stay bounded.

        A place goes by GPU time, not by arrival: a new holder with the places full takes the place
        of the holder that booked the least (the oldest to hold it among equals) of those not
        holding the GPU now, whose series then end (its time stays in Prometheus; a return starts
        new counters, a reset ``increase()`` handles).  Short-lived holders (twenty half-second
        jobs) thus never keep a long job that comes after them out of its own series; one holding
        the GPU now never loses its place, so its counters never go back.  Only where every place
        is held now does a newcomer count as 'other'.  ``holding``: who holds any part of the GPU now."""
        if self.pod_mode:
            return shares
        others = set(OTHERS.values())
        known = {h for h in book.held_at if h != NOBODY and h not in others}
        out: dict[Holder, float] = {}
        for holder, share in shares:
            if holder != NOBODY and holder.kind != POD and holder not in known:
                if len(known) >= self.max_users:
                    idle = [h for h in known if h not in holding]
                    if idle:
                        gone = min(idle, key=lambda h: (self._booked(book, h), book.held_at[h], h))
                        self._drop(book, gone)
                        known.discard(gone)
                        known.add(holder)
                    else:
                        holder = OTHERS[holder.kind]
                else:
                    known.add(holder)
            out[holder] = out.get(holder, 0.0) + share
        return list(out.items())

    @staticmethod
    def _booked(book: _Book, holder: Holder) -> float:
        return sum(v for (h, _, _), v in book.seconds.items() if h == holder)

    @staticmethod
    def _drop(book: _Book, holder: Holder) -> None:
        del book.held_at[holder]
        for key in [k for k in book.seconds if k[0] == holder]:
            del book.seconds[key]

    def _forget(self, book: _Book, now: float) -> None:
        """A holder gone for ``holder_retention`` leaves the books: its counters end, and a return
        starts new ones (a counter reset to Prometheus, which ``increase()`` handles)."""
        for holder, at in list(book.held_at.items()):
            if holder != NOBODY and now - at > self.holder_retention:
                self._drop(book, holder)

    def _render(self, now: float) -> AccountingView:
        prices = self.prices
        gpus = []
        for book in sorted(self._books.values(), key=lambda b: (b.index, b.uuid)):
            price = prices.per_hour(book.name) if prices else None
            gpus.append(GpuAccount(
                index=book.index, uuid=book.uuid, state=book.state, pods=book.pods, jobs=book.jobs,
                containers=book.containers,
                seconds=tuple((h, s, v) for (h, s, i), v in sorted(book.seconds.items()) if i == WHOLE),
                instance_seconds=tuple(sorted((i, h, s, v) for (h, s, i), v in book.seconds.items() if i != WHOLE)),
                last_active=book.last_active,
                memory_peak_bytes=book.peak.max(now) if book.state != DOWN else None,
                price_per_hour=price, energy_price_per_kwh=prices.energy_per_kwh if prices and book.name else None,
            ))  # fmt: skip
        return AccountingView(prices.currency if prices else None, tuple(gpus))

    def view(self) -> AccountingView:
        """The books after the latest snapshot (immutable; safe to read from any thread)."""
        return self._view
