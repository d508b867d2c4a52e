"""What a card the report might suggest costs: only a price the user gave, never a made-up one.

Three places hold one, in this order:

1. a catalogue of the user's own (``--catalogue FILE``) with ``price_per_hour``, when its
   ``currency`` is the report's;
2. the ``pricing`` section of the config (``--config FILE``, the daemon's file): a card costs what
   the daemon would charge for a GPU of that card, its key matched as the daemon matches it, against
   the card's names as NVML reports them (the catalogue's ``names``: "A100-SXM4-80GB" prices the
   "NVIDIA A100-SXM4-80GB", so the catalogue's "A100 80GB", and not the "NVIDIA A100 80GB PCIe"); the
   dearest of its names where they differ, so that a saving is never overstated.  A card of a
   catalogue of the user's own without names is matched by its own name.  In the section's currency;
   its ``default`` prices no card (it is what the daemon charges for a GPU it has no model price for,
   not a quote for a card);
3. the store: what the fleet pays now (``gpu_price_per_hour`` at the end of the range) for GPUs of
   that card, the highest where GPUs of one card are priced differently (reserved and on-demand),
   so that a saving is never overstated.

A MIG profile costs its share of its card (slices / 7).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
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
        names = self.catalogue.names.get(card, (card,))
        # As the daemon prices a GPU of each name: its longest matching key.
        priced = [next((p for pattern, p in self._keys if pattern.search(name)), None) for name in names]
        if found := [p for p in priced if p is not None]:
            return Price(max(found), PRICING)
        if card in self.fleet:
            return Price(self.fleet[card], STORE)
        return None

    def of(self, offer: Offer) -> Price | None:
        whole = self.card(offer.card)
        return None if whole is None else Price(whole.per_hour * offer.share, whole.source)


_VENDOR = re.compile(r"^(NVIDIA|Tesla)\s+", re.IGNORECASE)
# A model's word: letters then digits (H100, A100, L40S, V100), not a size (80GB) or a form (SXM4).
_MODEL_WORD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{1,3}\d{1,4}[A-Za-z]?(?![A-Za-z0-9])")
_FORMS = re.compile(r"^(SXM|PCIE|HBM|GDDR)\d*$", re.IGNORECASE)


def _models(text: str) -> set[str]:
    return {w.lower() for w in _MODEL_WORD.findall(text) if not _FORMS.match(w)}


def key_problems(models: Mapping[str, float], catalogue: Catalogue) -> tuple[list[str], list[str]]:
    """The pricing keys that would not mean the same card in the daemon and in the report: (refused,
    doubtful).  Refused: a key that names a card of the catalogue as the report names it ("V100 SXM2
    16GB") but none of the names NVML gives a GPU (what the daemon matches keys against), so it would
    price that card in a reader's mind and no GPU in the daemon.  Doubtful: a key of a model the
    catalogue knows (H100 in "H100 SXM") that matches none of its names; it may name a card the
    catalogue does not offer (an "H200 NVL"), so it is said, not refused.  Each with the names it
    could mean.  A key of another model (GH200, V100S, K80) is a card the catalogue does not know."""
    names = sorted({_VENDOR.sub("", n) for ns in catalogue.names.values() for n in ns})
    refused: list[str] = []
    doubtful: list[str] = []
    if not names:
        return refused, doubtful
    cards = [o.name for o in catalogue.offers if not o.mig]
    for key in sorted(models):
        pattern = name_key(key)
        if any(pattern.search(n) for ns in catalogue.names.values() for n in ns):
            continue
        words = _models(key)
        like = [n for n in names if words & _models(n)]
        like.sort(key=lambda n: -difflib.SequenceMatcher(None, key.lower(), n.lower()).ratio())
        named = [c for c in cards if pattern.search(c)]
        if named:
            like = [_VENDOR.sub("", n) for c in named for n in catalogue.names.get(c, ())] + [
                n for n in like if n not in {_VENDOR.sub("", m) for c in named for m in catalogue.names.get(c, ())}
            ]
            refused.append(f"pricing key {key!r} names the catalogue's {', '.join(named)} but none of the names NVML "
                           f"gives a GPU, so the daemon would charge no GPU by it; write the name NVML gives it: "
                           f"{', '.join(repr(n) for n in like)}")  # fmt: skip
        elif like:
            doubtful.append(f"pricing key {key!r} matches none of the names NVML gives the cards of its model the "
                            f"catalogue knows; unless it names another card, it could mean "
                            f"{', '.join(repr(n) for n in like)}")  # fmt: skip
    return refused, doubtful
