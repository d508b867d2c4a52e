"""What a card the report might suggest costs: only a price the user gave, never a made-up one.

Three places hold one, in this order:

1. a catalogue of the user's own (``--catalogue FILE``) with ``price_per_hour``, when its
   ``currency`` is the report's;
2. the ``pricing`` section of the config (``--config FILE``, the daemon's file): a model key prices
   a card whose name holds it as a word ("H100" prices "H100 80GB" and "H100 PCIe", "L4" prices the
   L4 and not the L40S), in the section's currency; its ``default`` prices no card (it is what the
   daemon charges for a GPU it has no model price for, not a quote for a card);
3. the store: what the fleet pays now (``gpu_price_per_hour`` at the end of the range) for GPUs of
   that card, the highest where GPUs of one card are priced differently (reserved and on-demand),
   so that a saving is never overstated.

A MIG profile costs its share of its card (slices / 7).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..accounting.pricing import name_key
from ..accounting.settings import PricingSettings
from .catalogue import Catalogue, Offer

CATALOGUE, PRICING, STORE = "your catalogue", "the pricing settings", "the store's gpu_price_per_hour"


@dataclass(frozen=True)
class Price:
    per_hour: float
    source: str  # CATALOGUE, PRICING or STORE


class PriceList:
    def __init__(self, catalogue: Catalogue, currency: str | None, fleet: dict[str, float],
                 pricing: PricingSettings | None = None) -> None:  # fmt: skip
        """``fleet``: card name -> what the fleet pays now for a GPU of that card, in ``currency``."""
        self.catalogue, self.currency, self.fleet = catalogue, currency, fleet
        self.pricing = pricing if pricing is not None and currency and pricing.currency == currency else None
        # Longest key first, as the daemon matches them: "H100 NVL" before "H100".
        keys = sorted((self.pricing.models if self.pricing else {}).items(), key=lambda kv: -len(kv[0]))
        self._keys = [(name_key(k), p) for k, p in keys]

    def card(self, card: str) -> Price | None:
        """The price of a whole card, from the first place that has one."""
        offer = next((o for o in self.catalogue.offers if o.name == card), None)
        if (
            offer is not None
            and offer.price_per_hour is not None
            and self.currency
            and self.catalogue.currency == self.currency
        ):
            return Price(offer.price_per_hour, CATALOGUE)
        for pattern, price in self._keys:
            if pattern.search(card):
                return Price(price, PRICING)
        if card in self.fleet:
            return Price(self.fleet[card], STORE)
        return None

    def of(self, offer: Offer) -> Price | None:
        whole = self.card(offer.card)
        return None if whole is None else Price(whole.per_hour * offer.share, whole.source)
