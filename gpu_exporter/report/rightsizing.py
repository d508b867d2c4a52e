"""Right-sizing, in the style of Kruize: what smaller card or MIG profile would do a GPU's work for less.

1. The job's needs: the p98 of its memory peaks times a headroom (1.2), and the compute it used,
   the p95 of its activity times the current card's FP16 TFLOPS.
2. Every card or MIG profile in the catalogue whose memory holds that need is a candidate.
3. Each candidate's cost is its price x the hours x the slowdown, where the slowdown is the compute
   needed / the candidate's TFLOPS, at least 1: a faster card is not assumed to speed the job up
   (it was not using the card it has), a slower one makes it take longer, and pay for longer.
4. The cheapest candidate is suggested where it saves at least ``min_saving_ratio`` (20%) of what the
   GPU's held hours cost and at least ``min_saving`` a month; a saving exactly at a threshold counts.

Memory that frameworks reserve up front (TensorFlow, JAX) makes a job look as big as the card: where
the peak is the whole card, no card is suggested and a note says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalogue import GIB, Catalogue, Offer

HEADROOM = 1.2
HOURS_PER_MONTH = 730.0
FULL_CARD = 0.95  # a p98 peak at this share of the card's memory is "the whole card"
RESERVED_NOTE = (
    "peak memory is the whole card ({peak:.1f} of {total:.1f} GiB): frameworks that reserve memory up front "
    "(TensorFlow, JAX, some PyTorch allocators) make a job look this big; set TF_FORCE_GPU_ALLOW_GROWTH=true or "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false to see what it needs before sizing it"
)


@dataclass(frozen=True)
class Usage:
    """What right-sizing knows of one GPU over the report's range."""

    node: str
    gpu: str
    uuid: str
    model: str | None
    holder: str  # "pod ml/train-a", "user alice", "" for nobody
    held_hours: float  # busy + allocated_idle
    idle_hours: float  # idle and held by nobody
    range_hours: float
    price_per_hour: float | None  # what it costs now (Prometheus), else None
    memory_total_bytes: float | None
    memory_peak_bytes: float | None  # p98 of the peaks
    activity_p95: float | None
    activity_signal: str  # "SM activity" or "GPU utilization"
    mig_mode: bool = False


@dataclass(frozen=True)
class Advice:
    suggested: str
    reason: str
    saving_per_month: float
    suggested_price_per_hour: float | None = None
    slowdown: float = 1.0


def money(amount: float, currency: str | None) -> str:
    symbol = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}.get(currency or "")
    figure = f"{amount:,.0f}" if abs(amount) >= 100 else f"{amount:,.2f}"
    return f"{symbol}{figure}" if symbol else f"{figure} {currency or ''}".rstrip()


def article(name: str) -> str:
    """'an' before a name read with a vowel sound first (an H100, an L4, an A100), else 'a' (a T4)."""
    return "an" if name[:1].upper() in "AEFHILMNORSX" else "a"


def hours_text(h: float) -> str:
    return f"{h:,.0f} h" if h >= 10 else (f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min")


class Sizer:
    def __init__(self, catalogue: Catalogue, currency: str | None, fleet_prices: dict[str, float],
                 min_saving: float = 0.0, min_saving_ratio: float = 0.2) -> None:  # fmt: skip
        """``fleet_prices``: what the fleet pays per hour for each catalogue card, from Prometheus."""
        self.catalogue = catalogue
        self.currency = currency
        self.fleet_prices = fleet_prices
        self.min_saving = min_saving
        self.min_saving_ratio = min_saving_ratio

    def price(self, offer: Offer) -> float | None:
        """The fleet's price for the card, else the catalogue's reference price in the same currency."""
        whole = self.fleet_prices.get(offer.card)
        if whole is not None:
            return whole * offer.share
        if offer.reference_price_per_hour is not None and self.catalogue.currency == self.currency:
            return offer.reference_price_per_hour
        return None

    def notes(self, u: Usage) -> list[str]:
        if u.memory_peak_bytes and u.memory_total_bytes and u.memory_peak_bytes >= FULL_CARD * u.memory_total_bytes:
            return [RESERVED_NOTE.format(peak=u.memory_peak_bytes / GIB, total=u.memory_total_bytes / GIB)]
        return []

    def advise(self, u: Usage) -> Advice | None:
        current = self.catalogue.card_of(u.model) if u.model else None
        if current is None or u.mig_mode or u.range_hours <= 0:
            return None
        price_now = u.price_per_hour if u.price_per_hour is not None else self.price(current)
        if price_now is None or price_now <= 0:
            return None
        per_month = HOURS_PER_MONTH / u.range_hours
        where = f"GPU {u.gpu} on {u.node} ({u.model})"
        if u.held_hours <= 0:
            if u.idle_hours < 0.95 * u.range_hours:
                return None
            saving = price_now * u.idle_hours * per_month
            if not self._worth(saving, price_now * u.range_hours * per_month):
                return None
            reason = (f"{where} sat idle, held by nobody, for {hours_text(u.idle_hours)} of "
                      f"{hours_text(u.range_hours)}; releasing it would save an estimated "
                      f"{money(saving, self.currency)}/month")  # fmt: skip
            return Advice("release", reason, saving, 0.0)
        if u.memory_peak_bytes is None or u.activity_p95 is None or self.notes(u):
            return None
        need_memory = u.memory_peak_bytes * HEADROOM
        need_tflops = u.activity_p95 * current.fp16_tflops
        best: tuple[tuple[float, float, float], Offer, float, float] | None = None
        for offer in self.catalogue.offers:
            if (offer.card == current.name and not offer.is_mig) or offer.memory_bytes < need_memory:
                continue
            price = self.price(offer)
            if price is None:
                continue
            slowdown = max(1.0, need_tflops / offer.fp16_tflops)
            # The cheapest for the work; at the same cost the one that slows the job least, then the
            # smallest. A card's MIG slices that are all too slow for a job cost it the same (fewer
            # slices for longer): of those, the one that takes least long. Rounded, so that float
            # noise does not decide a tie.
            rank = (round(price * slowdown, 9), round(slowdown, 9), offer.memory_bytes)
            if best is None or rank < best[0]:
                best = (rank, offer, price, slowdown)
        if best is None:
            return None
        _, offer, price, slowdown = best
        cost_per_hour = price * slowdown
        saving = (price_now - cost_per_hour) * u.held_hours * per_month
        if not self._worth(saving, price_now * u.held_hours * per_month):
            return None
        # Over a peak of 0 (a job that never touched the memory) headroom is no percentage: left out.
        room = (
            f" with {(offer.memory_bytes / u.memory_peak_bytes - 1) * 100:.0f}% headroom" if u.memory_peak_bytes else ""
        )
        who = u.holder or "an unattributed process"
        slower = f", taking about {slowdown:.1f}x as long" if slowdown > 1.05 else ""
        reason = (f"{who} peaked at {u.memory_peak_bytes / GIB:.1f} GiB and {u.activity_p95 * 100:.0f}% "
                  f"{u.activity_signal} on {u.model} ({where.split(' (')[0]}) for {hours_text(u.held_hours)}; "
                  f"{article(offer.name)} {offer.name} would hold it{room}{slower}; "
                  f"estimated saving {money(saving, self.currency)}/month")  # fmt: skip
        return Advice(offer.name, reason, saving, price, slowdown)

    def _worth(self, saving: float, cost_now: float) -> bool:
        """At least both thresholds, a saving exactly at one included: the figures come from float
        arithmetic, so "exactly" is within a billionth, or 20% of 3.00 vs 2.40 would fall either side."""
        slack = 1 - 1e-9
        return saving > 0 and saving >= self.min_saving * slack and saving >= self.min_saving_ratio * cost_now * slack
