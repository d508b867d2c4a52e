"""Advice a platform engineer can act on: release a GPU nobody uses, reclaim one held but idle, or
move a job to a cheaper card or MIG slice that holds it and does its work at least as fast.

Judged on the time the exporter saw each GPU (``seen``: every hour it counted, down included),
never on the requested range:

1. **release**: idle and held by nobody for at least 90% of the time it was up. Saving: the cost
   of those idle hours, per month.
2. **reclaim** from its holder: held but idle for at least half the time it was held. Saving: the
   cost of the held-but-idle hours, per month.
3. **a cheaper card or MIG slice**, for a job on a card of the catalogue, out of MIG mode:
   - its memory holds the highest memory use seen over the range (not a percentile) x 1.2;
   - it does the work at least as fast, judged on the bursts (the p95 over the range of each
     step's highest poll while held): the compute the job used (its SM activity, else GPU-Util, x
     its card's tensor rate), each pipe it used (GPM's tensor, FP64, FP32 and FP16 activity x its
     card's rate for that pipe) and the memory bandwidth it used (DRAM activity x its card's) each
     fit within the candidate's.  Unknown is not zero: without GPM, every pipe and the bandwidth
     are taken to be as busy as GPU-Util says the card was, and a card whose rate for a pipe the
     job uses is unknown is not suggested;
   - where the job moved data between GPUs over NVLink (1 GB/s or more each way), the candidate has
     NVLink at least that fast (so never a MIG slice, which has no peer-to-peer traffic); where the
     GPU's NVLink traffic is unknown, at least the NVLink of its card (a GPU that has no NVLink links,
     ``gpu_nvlink_links`` 0, moved nothing over NVLink: known, not unknown);
   - it has a price the user gave (``prices``), lower than what this GPU costs now: never the
     same card, its full-card MIG profile, or a card at the same or a higher price;
   - GeForce cards only with ``allow_consumer``.
   The cheapest such offer wins (then the one with least memory). Saving: the difference in price
   x 730 h a month.
4. With ``allow_slower``, where no cheaper card is as fast, the cheapest slower one by the cost of
   the work (price x time) is shown as its own answer: cost and time side by side, and no monthly
   saving, never the headline.

Before 3, a GPU held on a PCIe link that trained below what its card and slot allow, or whose link
was 90% full or more for a tenth of its held time at bursts below 80% activity, is told to fix the
link (reseat, BIOS, riser, slot) and is not sized: its activity is what the link let through.  A GPU
busy enough to size that gets no advice carries a note saying what stopped it (``decide``).

A monthly figure needs ``min_history_hours`` (24 h) of what the exporter saw: below that, the
advice says how much it saw and gives none. Savings must reach ``min_saving`` a month and
``min_saving_ratio`` of what the GPU costs (a saving exactly at either counts).

Memory that frameworks reserve up front (TensorFlow, JAX) makes a job look as big as the card:
where the highest use is the whole card, no card is suggested and a note says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from .catalogue import GIB, PIPES, Catalogue, Offer
from .prices import Price, PriceList
from .queries import LINK_BOUND

HEADROOM = 1.2
HOURS_PER_MONTH = 730.0
FULL_CARD = 0.95  # the highest memory use at this share of the card is "the whole card"
RELEASE_SHARE = 0.9  # of the time up, idle and held by nobody
RECLAIM_SHARE = 0.5  # of the time held, idle
LINK_BOUND_PCT = round(LINK_BOUND * 100)
MIN_HISTORY_HOURS = 24.0
USED = 0.01  # a pipe busy less than this (1%) at its bursts is not used: GPM's noise floor
NVLINK_USED = 1e9  # bytes/s each way: below this a job moved no data over NVLink worth keeping
PIPE_NAMES = {"tensor": "tensor", "fp64": "FP64", "fp32": "FP32", "fp16": "FP16"}
COMPUTE, BANDWIDTH = "compute", "bandwidth"  # the needs besides the pipes
CARD, MIG, RELEASE, RECLAIM, SLOWER, LINK = "card", "mig", "release", "reclaim", "slower", "link"
# Why a card in MIG mode with work on it gets no card: each slice is its own (reclaimed where idle).
MIG_NOT_SIZED = ("not sized: it is in MIG mode, and its slices are not sized as a card (each idle slice is "
                 "reclaimed on its own; the card is released only where all of it sits idle)")  # fmt: skip
# A GPU whose link was at LINK_BOUND (queries.py) for this share of its held time or more, at activity
# below STARVED_ACTIVITY, waits on the bus: the activity the card would be sized on is what the link let
# through.
BOUND_SHARE = 0.1
STARVED_ACTIVITY = 0.8
# PCIe's transfer rate per lane (GT/s) by generation, and its line code's efficiency: 8b/10b for Gen1-2,
# 128b/130b for Gen3-5, 242/256 (FLIT) for Gen6 (PCI-SIG; as snapshot.pcie_link_bytes_per_second).
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
OWN_PRICE = "this GPU's price"
RESERVED_NOTE = (
    "peak memory is the whole card ({peak:.1f} of {total:.1f} GiB): frameworks that reserve memory up front "
    "(TensorFlow, JAX, some PyTorch allocators) make a job look this big; set TF_FORCE_GPU_ALLOW_GROWTH=true or "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false to see what it needs before sizing it"
)

UNRATED_NOTE = (
    "not sized: at its bursts the work used {pipes} (GPM's pipe activity), and the catalogue states no rate "
    "for {which} on {card}, so what it needs of another card cannot be told (a catalogue of your own, "
    "--catalogue FILE, can give the rate)"
)


def pcie_bytes_per_second(generation: float | None, width: float | None) -> float | None:
    """One direction's usable bandwidth of a PCIe link of this generation and width."""
    if generation is None or width is None or int(generation) not in PCIE_GTS:
        return None
    gen = int(generation)
    code = 0.8 if gen <= 2 else (128 / 130 if gen <= 5 else 242 / 256)
    return PCIE_GTS[gen] * 1e9 * code / 8 * width


@dataclass(frozen=True)
class Link:
    """A GPU's PCIe link over the range: the generation and width it reached (the highest: an idle card
    trains down) and the most the card and slot allow, the p95 of its traffic each way while held as a
    share of the link, and the hours it was held at LINK_BOUND of the link or more."""

    generation: float | None = None
    max_generation: float | None = None
    width: float | None = None
    max_width: float | None = None
    rx_share: float | None = None
    tx_share: float | None = None
    bound_hours: float = 0.0

    @property
    def degraded(self) -> bool:
        """Trained below what the card and slot allow: a card reseated, a BIOS, a riser or a slot away."""
        below = (self.generation is not None and self.max_generation is not None
                 and self.generation < self.max_generation)  # fmt: skip
        return below or (self.width is not None and self.max_width is not None and self.width < self.max_width)

    @staticmethod
    def text(generation: float | None, width: float | None) -> str:
        gen = "Gen?" if generation is None else f"Gen{generation:.0f}"
        lanes = "x?" if width is None else f"x{width:.0f}"
        rate = pcie_bytes_per_second(generation, width)
        return f"{gen} {lanes}" + ("" if rate is None else f" ({rate / 1e9:.1f} GB/s each way)")

    @classmethod
    def of(cls, facts: Mapping[str, float], held_hours: float) -> Link | None:
        """From the report's ``links``, ``pcie_load`` and ``pcie_bound`` answers (queries.LINK_FACTS,
        ``rx``, ``tx``, ``bound_seconds``); None where the store has no PCIe link series of the GPU.  The
        bound time is whole steps, the held time the counters' own: never more bound than held."""
        if "pcie_gen" not in facts and "rx" not in facts and "tx" not in facts:
            return None
        return cls(facts.get("pcie_gen"), facts.get("pcie_max_gen"), facts.get("pcie_width"),
                   facts.get("pcie_max_width"), facts.get("rx"), facts.get("tx"),
                   min(facts.get("bound_seconds", 0.0) / 3600, held_hours))  # fmt: skip


@dataclass(frozen=True)
class Usage:
    """What right-sizing knows of one GPU over the report's range."""

    node: str
    gpu: str
    uuid: str
    model: str | None
    holder: str  # who held it longest: "pod ml/train-a", "user alice", "" for nobody known
    idle_holder: str  # who held it longest while it sat idle
    busy_hours: float
    allocated_idle_hours: float
    idle_hours: float  # idle and held by nobody
    down_hours: float
    price_per_hour: float | None  # what it costs now (its last price in the range), else None
    memory_total_bytes: float | None
    memory_peak_bytes: float | None  # the highest over the range
    activity_p95: float | None  # while held
    activity_signal: str  # "SM activity" or "GPU utilization"
    dram_p95: float | None = None  # DRAM bandwidth used / peak, while held, where the GPU has GPM
    mig_mode: bool = False
    # Each GPM pipe's activity at its bursts while held (PIPES; None: the GPU has no GPM; a pipe left
    # out is unknown: both are taken to be as busy as ``activity_p95``).
    pipes: Mapping[str, float] | None = None
    # NVLink data sent while held, bytes/s: the p95 of each step's mean rate (None: unknown, no NVLink
    # counters).
    nvlink_bytes_per_second: float | None = None
    # The GPUs of one holder sized together (``job``): each needs what the busiest needed, and the
    # advice is for all of them; ``gpu`` then names them all.
    count: int = 1
    unknown_hours: float = 0.0  # held, activity unknown (a MIG slice without GPM): neither busy nor idle
    # One GPU instance of a card in MIG mode (its id; "" for a whole GPU), at ``share`` of the card: its
    # hours are its own, its price the card's x its share.
    instance: str = ""
    share: float = 1.0
    link: Link | None = None  # its PCIe link (None: the store has no PCIe link series of it)
    # Where it is, as the report shows it: its node, and where two GPUs of one index share a node label
    # (two exporters on one host), what tells them apart (the instance, else the UUID); "": the node.
    shown_as: str = ""

    @property
    def place(self) -> str:
        return self.shown_as or self.node

    @property
    def held_hours(self) -> float:
        return self.busy_hours + self.allocated_idle_hours + self.unknown_hours

    @property
    def up_hours(self) -> float:
        return self.held_hours + self.idle_hours

    @property
    def seen_hours(self) -> float:
        return self.up_hours + self.down_hours


@dataclass(frozen=True)
class Advice:
    kind: str  # CARD, MIG, RELEASE, RECLAIM or SLOWER
    suggested: str
    reason: str
    saving_per_month: float | None  # None: too little history, no price, or a slower card
    suggested_price_per_hour: float | None = None
    slowdown: float = 1.0
    price_source: str | None = None


def money(amount: float, currency: str | None) -> str:
    symbol = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}.get(currency or "")
    figure = f"{amount:,.0f}" if abs(amount) >= 100 else f"{amount:,.2f}"
    return f"{symbol}{figure}" if symbol else f"{figure} {currency or ''}".rstrip()


def article(name: str) -> str:
    """'an' before a name read with a vowel sound first (an H100, an L4, an A100), else 'a' (a T4)."""
    return "an" if name[:1].upper() in "AEFHILMNORSX" else "a"


def hours_text(h: float) -> str:
    return f"{h:,.0f} h" if h >= 10 else (f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min")


def _pct(part: float, whole: float) -> str:
    return f"{part / whole * 100:.0f}%"


def _capacity(offer: Offer, need: str) -> float | None:
    if need == COMPUTE:
        return offer.fp16_tflops
    return offer.memory_bandwidth_gbps if need == BANDWIDTH else offer.rate(need)


def gpu_order(gpu: str) -> tuple[int, str]:
    """GPU 2 before GPU 10: the index as a number; anything else after every number, by name."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _slowdown(needs: list[tuple[float, str]], offer: Offer) -> float | None:
    """How many times as long the work would take on ``offer``: its worst need over capacity (None
    where a capacity the work needs is unknown)."""
    worst = 0.0
    for amount, need in needs:
        cap = _capacity(offer, need)
        if cap is None:
            return None
        worst = max(worst, amount / cap)
    return worst


def _pipes_text(u: Usage) -> str:
    used = [f"{PIPE_NAMES[p]} {u.pipes[p] * 100:.0f}%" for p in PIPES if u.pipes and u.pipes.get(p, 0.0) >= USED]
    return f", pipes {', '.join(used)}" if used else ""


def _nvlink_text(u: Usage) -> str:
    if u.nvlink_bytes_per_second is None or u.nvlink_bytes_per_second < NVLINK_USED:
        return ""
    return f", NVLink {u.nvlink_bytes_per_second / 1e9:.0f} GB/s each way"


def _links_text(u: Usage, offer: Offer) -> str:
    """The candidate's interconnect, where the job moved data over NVLink."""
    if u.nvlink_bytes_per_second is None or u.nvlink_bytes_per_second < NVLINK_USED:
        return ""
    return f" (NVLink, {offer.nvlink_gbps_each_way:.0f} GB/s each way)"


def _assumed_text(u: Usage, current: Offer) -> str:
    """The assumptions made where a signal is missing, in words."""
    said = []
    if u.pipes is None or u.dram_p95 is None:
        missing = "pipe and DRAM activity" if u.pipes is None and u.dram_p95 is None else (
            "pipe activity" if u.pipes is None else "DRAM activity")  # fmt: skip
        said.append(f"the GPU gives no {missing}, so the work is taken to keep every pipe and the memory bandwidth "
                    f"as busy as its {u.activity_p95 or 0:.0%} {u.activity_signal}")  # fmt: skip
    if u.nvlink_bytes_per_second is None and current.nvlink_gbps_each_way > 0:
        said.append(f"its NVLink traffic is unknown, so only cards with NVLink at least as fast as "
                    f"{article(current.name)} {current.name}'s are considered")  # fmt: skip
    return f"; {'; '.join(said)}" if said else ""


class Sizer:
    def __init__(self, catalogue: Catalogue, prices: PriceList, *, min_saving: float = 0.0,
                 min_saving_ratio: float = 0.2, min_history_hours: float = MIN_HISTORY_HOURS,
                 allow_slower: bool = False, allow_consumer: bool = False) -> None:  # fmt: skip
        self.catalogue = catalogue
        self.prices = prices
        self.currency = prices.currency
        self.min_saving = min_saving
        self.min_saving_ratio = min_saving_ratio
        self.min_history_hours = min_history_hours
        self.allow_slower = allow_slower
        self.allow_consumer = allow_consumer

    def notes(self, u: Usage) -> list[str]:
        if u.memory_peak_bytes and u.memory_total_bytes and u.memory_peak_bytes >= FULL_CARD * u.memory_total_bytes:
            return [RESERVED_NOTE.format(peak=u.memory_peak_bytes / GIB, total=u.memory_total_bytes / GIB)]
        return self._unrated(u)

    def _unrated(self, u: Usage) -> list[str]:
        """Why a GPU is not sized where GPM says the work used a pipe whose rate on its own card the
        catalogue does not state (``_needs``: what it needs cannot be told), so that no advice is no
        silence."""
        current = self.catalogue.card_of(u.model) if u.model else None
        if current is None or u.mig_mode or u.pipes is None or u.activity_p95 is None:
            return []
        unrated = [f"{PIPE_NAMES[p]} {busy * 100:.0f}%" for p in PIPES
                   if (busy := u.pipes.get(p, u.activity_p95)) >= USED and current.rate(p) is None]  # fmt: skip
        if not unrated:
            return []
        which = "that pipe" if len(unrated) == 1 else "those pipes"
        return [
            UNRATED_NOTE.format(pipes=", ".join(unrated), which=which, card=f"{article(current.name)} {current.name}")
        ]

    def advise(self, u: Usage) -> Advice | None:
        decided = self.decide(u)
        return decided if isinstance(decided, Advice) else None

    def decide(self, u: Usage) -> Advice | str | None:
        """The advice for ``u``; else, for a GPU busy enough to size, why it gets none (a note: an unknown
        signal, no cheaper card that fits, a saving too small), so that no advice is never silence; else
        None (not up, or idle and not worth releasing or reclaiming, or a note already says why)."""
        if u.up_hours <= 0:
            return None
        kind = self.waste(u)
        if kind == RELEASE:
            return self._release(u)
        if kind == RECLAIM:
            return self._reclaim(u)
        if (fix := self.starved(u)) is not None:
            return fix
        return self._size(u)

    def advise_slice(self, u: Usage) -> Advice | None:
        """A MIG slice's advice: reclaimed from its holder where held but idle (as a GPU), never released
        or resized on its own (the card is released whole, where all of it sits idle: ``advise``)."""
        return self._reclaim(u) if u.up_hours > 0 and self.waste(u) == RECLAIM else None

    # -- a link that starves the GPU ----------------------------------------------------------------------
    def starved(self, u: Usage) -> Advice | None:
        """A GPU held on a PCIe link trained below what its card and slot allow, or one whose traffic sat
        at the link's capacity while its activity stayed low: the link is fixed before any card is
        sized, since the activity the card would be sized on is what the link let through."""
        link = u.link
        if link is None or u.held_hours <= 0 or u.mig_mode:
            return None
        low = u.activity_p95 is None or u.activity_p95 < STARVED_ACTIVITY
        bound = link.bound_hours >= BOUND_SHARE * u.held_hours and link.bound_hours > 0
        if not ((link.degraded and u.busy_hours > 0) or (bound and low)):
            return None
        said = [f"{self._where(u)} is held on a PCIe link at {Link.text(link.generation, link.width)}"]
        if link.degraded:
            said[0] += (f" where its card and slot allow {Link.text(link.max_generation, link.max_width)}: the link "
                        "trained below its maximum")  # fmt: skip
        ways = [f"{name} {share * 100:.0f}%" for name, share in (("RX", link.rx_share), ("TX", link.tx_share))
                if share is not None and share >= 0.01]  # fmt: skip
        if ways:
            said.append(f"its traffic while held reached {' and '.join(ways)} of the link (p95 of each step's mean)")
        if link.bound_hours > 0:
            cost = (f", which cost {money(link.bound_hours * u.price_per_hour, self.currency)}"
                    if u.price_per_hour else "")  # fmt: skip
            said.append(
                f"it was link-bound (the link {LINK_BOUND_PCT}% full or more) for "
                f"{hours_text(link.bound_hours)} of the {hours_text(u.held_hours)} it was held{cost}"
            )
        if u.activity_p95 is not None:
            said.append(f"its bursts reached only {u.activity_p95 * 100:.0f}% {u.activity_signal}")
        fix = ("fix the link before moving the work: reseat the card, check the slot's PCIe setting in the BIOS "
               "(a slot forced to a lower generation), replace a riser or retimer that cannot carry the card's "
               "generation, or move the card to a slot wired for all its lanes; then size it again, since the "
               "activity seen is what the link let through" if link.degraded else
               "the GPU waits on the bus: check that the link trained at the card's maximum (reseat, BIOS, riser, "
               "slot), then cut what the job moves over PCIe (pinned memory, data kept on the GPU, a local copy "
               "of its input) before moving it to another card, which would be sized on what the link let "
               "through")  # fmt: skip
        return Advice(LINK, "fix the PCIe link", f"{'; '.join(said)}; {fix}", None)

    @staticmethod
    def waste(u: Usage) -> str | None:
        """RELEASE or RECLAIM where the GPU sat idle long enough for either (its advice, or none where
        not worth it, is that and never a card), else None: it is sized (with a job's other GPUs)."""
        if u.idle_hours >= RELEASE_SHARE * u.up_hours:
            return RELEASE
        if u.held_hours > 0 and u.allocated_idle_hours >= RECLAIM_SHARE * u.held_hours:
            return RECLAIM
        return None

    @staticmethod
    def together(members: list[Usage]) -> Usage | None:
        """The GPUs one holder held (a job, a pod, a container) as one GPU that needs what the busiest
        of them needed, each measure the highest of any (unknown where one is unknown), ``count`` of
        them, so that the advice is for all of them or none.  GPUs of different models, or held by
        different holders, are not sized together: None."""
        if len({(m.model, m.mig_mode) for m in members}) != 1 or len({m.holder for m in members}) != 1:
            return None
        first = min(members, key=lambda m: m.seen_hours)  # the hours of the one seen least: the least history

        def highest(values: list[float | None]) -> float | None:
            return None if any(v is None for v in values) else max(v for v in values if v is not None)

        pipes = None if any(m.pipes is None for m in members) else {
            p: v for p in PIPES if (v := highest([m.pipes.get(p) if m.pipes else None for m in members])) is not None
        }  # fmt: skip
        gpus = sorted(members, key=lambda m: (m.node, gpu_order(m.gpu)))
        prices = [m.price_per_hour for m in members]
        job = replace(
            first, gpu=", ".join(m.gpu for m in gpus), node=", ".join(dict.fromkeys(m.node for m in gpus)),
            shown_as=", ".join(dict.fromkeys(m.place for m in gpus)),
            uuid=", ".join(m.uuid for m in gpus), count=len(members),
            # The cheapest of them: the saving is never more than the dearest would make it.
            price_per_hour=None if any(p is None for p in prices) else min(p for p in prices if p is not None),
            memory_peak_bytes=highest([m.memory_peak_bytes for m in members]),
            activity_p95=highest([m.activity_p95 for m in members]), dram_p95=highest([m.dram_p95 for m in members]),
            pipes=pipes, nvlink_bytes_per_second=highest([m.nvlink_bytes_per_second for m in members]),
        )  # fmt: skip
        return job

    # -- release and reclaim --------------------------------------------------------------------------
    def _release(self, u: Usage) -> Advice | None:
        saving, price, cost = self._wasted(u, u.idle_hours)
        if not self._worth(saving, u.idle_hours / u.seen_hours):
            return None
        told = (f"{self._where(u)} sat idle, held by nobody, for {hours_text(u.idle_hours)} of the "
                f"{hours_text(u.seen_hours)} the exporter saw it ({_pct(u.idle_hours, u.seen_hours)}){cost}; "
                f"releasing it {self._saves(u, saving, price)}")  # fmt: skip
        return Advice(RELEASE, "release", told, saving, 0.0)

    def _reclaim(self, u: Usage) -> Advice | None:
        hours = u.allocated_idle_hours
        saving, price, cost = self._wasted(u, hours)
        if not self._worth(saving, hours / u.seen_hours):
            return None
        holder = u.idle_holder or "an unattributed process"
        told = (f"{self._where(u)} was held but left idle for {hours_text(hours)} of the {hours_text(u.held_hours)} it "
                f"was held ({_pct(hours, u.held_hours)}){cost}; reclaiming it from {holder} "
                f"{self._saves(u, saving, price)}")  # fmt: skip
        return Advice(RECLAIM, f"reclaim from {holder}", told, saving, 0.0)

    def _wasted(self, u: Usage, hours: float) -> tuple[float | None, float | None, str]:
        """What wasted hours save a month (None: no price, or too little history), the price they are at
        (a price of 0 is none to save), and what they cost, in words."""
        price = u.price_per_hour if u.price_per_hour else None
        if price is None:
            return None, None, ""
        saving = price * hours / u.seen_hours * HOURS_PER_MONTH if self._monthly(u) else None
        return saving, price, f", which cost {money(price * hours, self.currency)}"

    def _where(self, u: Usage) -> str:
        if u.instance:
            part = Fraction(u.share).limit_denominator(8)
            return (f"MIG slice {u.instance} ({part.numerator}/{part.denominator} of the card) of GPU {u.gpu} on "
                    f"{u.place} ({u.model or 'model unknown'})")  # fmt: skip
        return f"GPU {u.gpu} on {u.place} ({u.model or 'model unknown'})"

    # -- a cheaper card or slice ------------------------------------------------------------------------
    def _size(self, u: Usage) -> Advice | str | None:
        """The cheaper card or slice, else why none (None: a note of ``notes`` already says why)."""
        current = self.catalogue.card_of(u.model) if u.model else None
        price = u.price_per_hour
        if current is None:
            return (f"not sized: its model ({u.model or 'unknown'}) is not in the catalogue, so what it does per "
                    "second is unknown (a catalogue of your own, --catalogue FILE, can add it)")  # fmt: skip
        if u.mig_mode:
            return MIG_NOT_SIZED
        if not price:
            return "not sized: it has no price, so no card can be told cheaper (set the exporter's pricing section)"
        if u.memory_peak_bytes is None:
            return "not sized: its memory use is unknown (no gpu_memory_used_max_bytes in the store)"
        if u.activity_p95 is None:
            return "not sized: its activity while held is unknown (neither SM activity nor GPU utilization)"
        if self.notes(u):
            return None
        need_memory = u.memory_peak_bytes * HEADROOM
        needs = self._needs(u, current)
        if needs is None:
            return None
        fast: list[tuple[tuple[float, float, str], Offer, Price]] = []
        slow: list[tuple[tuple[float, float, float, str], Offer, Price, float]] = []
        # Why the cards priced below this one do not fit, counted by the first reason each fails on.
        cheaper, small, links, unrated = 0, 0, 0, 0
        for offer in self.catalogue.offers:
            if offer.consumer and not self.allow_consumer:
                continue
            if offer.mig and offer.whole_card:
                continue  # all of a card as one slice: the card itself is the offer
            if offer.card == current.name:
                if offer.whole_card:
                    continue  # the same card, or all of it as one MIG slice: nothing saved
                p: Price | None = Price(price * offer.share, OWN_PRICE)
            else:
                p = self.prices.of(offer)
            # Rounded, so that float noise never makes a card at the same price look cheaper.
            if p is None or round(p.per_hour, 9) >= round(price, 9):
                continue
            cheaper += 1
            if offer.memory_bytes < need_memory:
                small += 1
                continue
            if not self._links_hold(u, current, offer):
                links += 1
                continue
            slowdown = _slowdown(needs, offer)
            if slowdown is None:
                unrated += 1
                continue  # a rate the job needs is unknown for this card: neither as fast nor a known slowdown
            if round(slowdown, 9) <= 1:
                fast.append(((round(p.per_hour, 9), offer.memory_bytes, offer.name), offer, p))
            elif offer.card != current.name:  # a slower slice of its own card is the same card, busier
                slow.append(((round(p.per_hour * slowdown, 9), slowdown, offer.memory_bytes, offer.name), offer, p,
                             slowdown))  # fmt: skip
        who = u.holder or "an unattributed process"
        n = u.count
        where = f"GPU {u.gpu} on {u.place}" if n == 1 else f"{n} GPUs: {u.gpu} on {u.place}"
        used = (f"{who} used at most {u.memory_peak_bytes / GIB:.1f} GiB{' per GPU' if n > 1 else ''} on {u.model} "
                f"({where}) over {hours_text(u.seen_hours)}, its bursts reaching {u.activity_p95 * 100:.0f}% "
                f"{u.activity_signal}{self._dram(u)}{_pipes_text(u)}{_nvlink_text(u)} (p95 of each step's highest "
                f"while held{', the busiest of its GPUs' if n > 1 else ''}){_assumed_text(u, current)}")  # fmt: skip
        each = "" if n == 1 else " each"
        if fast:
            _, offer, p = min(fast, key=lambda x: x[0])
            saving = (price - p.per_hour) * n * HOURS_PER_MONTH if self._monthly(u) else None
            if not self._worth(saving, (price - p.per_hour) / price):
                figure = "" if saving is None else f" (about {money(saving, self.currency)}/month)"
                return (f"not advised: {article(offer.name)} {offer.name} holds it and is as fast at "
                        f"{money(p.per_hour, self.currency)}/h instead of {money(price, self.currency)}/h, but the "
                        f"saving{figure} is below --min-saving {money(self.min_saving, self.currency)} or "
                        f"--min-saving-ratio {self.min_saving_ratio:.0%}")  # fmt: skip
            room = (f" with {(offer.memory_bytes / u.memory_peak_bytes - 1) * 100:.0f}% headroom"
                    if u.memory_peak_bytes else "")  # fmt: skip
            cards = f"{article(offer.name)} {offer.name}" if n == 1 else f"{n} x {offer.name}"
            reason = (f"{used}; {cards}{_links_text(u, offer)} {'holds' if n == 1 else 'hold'} that{room} and "
                      f"{'is' if n == 1 else 'are'} at least as fast, at {money(p.per_hour, self.currency)}/h{each} "
                      f"({p.source}) instead of {money(price, self.currency)}/h{each}; moving it "
                      f"{self._saves(u, saving, price)}")  # fmt: skip
            return Advice(MIG if offer.mig else CARD, offer.name, reason, saving, p.per_hour, 1.0, p.source)
        none_fits = self._none_fits(u, current, price, need_memory, cheaper, small, links, unrated, len(slow))
        if not (self.allow_slower and slow):
            return none_fits
        (cost_of_work, *_), offer, p, slowdown = min(slow, key=lambda x: x[0])
        if cost_of_work >= round(price, 9):
            return f"{none_fits}; the cheapest slower one would cost more for the same work"
        work = u.busy_hours or u.held_hours
        cards = f"{article(offer.name).capitalize()} {offer.name} would" if n == 1 else f"{n} x {offer.name} would"
        reason = (f"{used}; no cheaper card is as fast. {cards} hold it but {'is' if n == 1 else 'are'} slower: the "
                  f"work of {hours_text(work)} would take about {slowdown:.1f}x as long "
                  f"({hours_text(work * slowdown)}), "
                  f"at {money(p.per_hour, self.currency)}/h{each} ({p.source}) instead of "
                  f"{money(price, self.currency)}/h{each}: {money(p.per_hour * work * slowdown * n, self.currency)} "
                  f"instead of {money(price * work * n, self.currency)} for the same work (price x time)")  # fmt: skip
        return Advice(SLOWER, offer.name, reason, None, p.per_hour, slowdown, p.source)

    def _none_fits(self, u: Usage, current: Offer, price: float, need_memory: float, cheaper: int, small: int,
                   links: int, unrated: int, slower: int) -> str:  # fmt: skip
        """Why no cheaper card fits, counted by the first reason each card or slice failed on."""
        if not cheaper:
            return (f"not sized: no card that could hold it has a price below its {money(price, self.currency)}/h "
                    "(the pricing section, a catalogue of your own or the store's prices give them)")  # fmt: skip
        why = []
        if small:
            why.append(f"{small} too small for {need_memory / GIB:.1f} GiB (its peak x {HEADROOM})")
        if links:
            if u.nvlink_bytes_per_second is None:
                why.append(f"{links} without NVLink as fast as {article(current.name)} {current.name}'s, which its "
                           "unknown NVLink traffic may need (no gpu_nvlink_* series, and no gpu_nvlink_links to say "
                           "it has none)")  # fmt: skip
            else:
                why.append(f"{links} without the NVLink its {u.nvlink_bytes_per_second / 1e9:.0f} GB/s each way needs")
        if unrated:
            why.append(f"{unrated} whose rate for a pipe it uses is unknown")
        if slower:
            why.append(f"{slower} slower at its bursts (--allow-slower shows the cheapest for the work)")
        return (f"no cheaper card fits: of the {cheaper} cards and slices priced below its "
                f"{money(price, self.currency)}/h, {', '.join(why)}")  # fmt: skip

    def _needs(self, u: Usage, current: Offer) -> list[tuple[float, str]] | None:
        """What the work needs of a card, each as (amount, the card's capacity for it): the compute its
        activity says (x the tensor rate, the measure before GPM told pipes apart), each pipe it used
        and the memory bandwidth.  Where GPM gives no pipe or DRAM activity, each is taken to be as busy
        as the activity signal.  None: the work used a pipe whose rate on its own card is unknown, so
        what it needs cannot be told."""
        assert u.activity_p95 is not None
        level = u.activity_p95
        needs = [(level * current.fp16_tflops, COMPUTE)]
        for pipe in PIPES:
            busy = level if u.pipes is None else u.pipes.get(pipe, level)  # a pipe not reported: as busy
            rate = current.rate(pipe)
            if busy < USED:
                continue
            if rate is None:
                if u.pipes is None:
                    continue  # assumed, on a card whose rate is unknown: nothing to scale
                return None
            needs.append((busy * rate, pipe))
        dram = level if u.dram_p95 is None else u.dram_p95
        needs.append((dram * current.memory_bandwidth_gbps, BANDWIDTH))
        return needs

    def _links_hold(self, u: Usage, current: Offer, offer: Offer) -> bool:
        """The candidate carries the NVLink traffic the job had (each way); unknown traffic, that of
        its card's NVLink."""
        if u.nvlink_bytes_per_second is None:
            return offer.nvlink_gbps_each_way >= current.nvlink_gbps_each_way
        return u.nvlink_bytes_per_second < NVLINK_USED or offer.nvlink_gbps_each_way * 1e9 >= u.nvlink_bytes_per_second

    # -- shared ------------------------------------------------------------------------------------------
    def _dram(self, u: Usage) -> str:
        return "" if u.dram_p95 is None else f" and {u.dram_p95 * 100:.0f}% DRAM bandwidth"

    def _monthly(self, u: Usage) -> bool:
        return u.seen_hours >= self.min_history_hours

    def _saves(self, u: Usage, saving: float | None, price: float | None) -> str:
        if saving is not None:
            return f"would save about {money(saving, self.currency)}/month"
        if price is None:
            return "would save what it costs (it has no price here, so no figure)"
        return (f"would pay off, but the exporter saw it for only {hours_text(u.seen_hours)}: a monthly figure needs "
                f"{hours_text(self.min_history_hours)} of history")  # fmt: skip

    def _worth(self, saving: float | None, share: float) -> bool:
        """At least both thresholds (``share``: of what the GPU costs), a saving exactly at one included:
        the figures come from float arithmetic, so "exactly" is within a billionth, or 20% of 3.00 vs
        2.40 would fall either side. Without a monthly figure, only the share can be judged."""
        slack = 1 - 1e-9
        if share <= 0 or share < self.min_saving_ratio * slack:
            return False
        return saving is None or saving >= self.min_saving * slack
