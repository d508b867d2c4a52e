"""Prices of GPUs by name, from the ``pricing:`` settings.

A model key prices a GPU whose name holds it as a word, case-insensitively: "H100" prices the
"NVIDIA H100 80GB HBM3" and the "NVIDIA H100 NVL", "L4" the "NVIDIA L4" and not the "NVIDIA L40S",
"H200" not the "NVIDIA GH200 480GB".  A key found anywhere in the name (as it was matched before
issue 37) priced an L40S at an L4's price, a GH200 at an H200's, an A10G at an A10's.  The report
matches keys the same way (``name_key``), so the daemon's cost and the report's agree.
"""

from __future__ import annotations

import re

from .settings import PricingSettings


def name_key(key: str) -> re.Pattern[str]:
    """What a model key matches in a GPU's name: the key as a word, in any case."""
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(key.strip())}(?![A-Za-z0-9])", re.IGNORECASE)


class PriceBook:
    def __init__(self, settings: PricingSettings) -> None:
        self.currency = settings.currency
        self.energy_per_kwh = settings.energy_per_kwh
        self._default = settings.default
        # Longest key first, so "H100 NVL" wins over "H100" for an "NVIDIA H100 NVL".
        self._models = [(name_key(k), p) for k, p in sorted(settings.models.items(), key=lambda kp: -len(kp[0]))]

    def per_hour(self, gpu_name: str | None) -> float | None:
        """The price per hour of a GPU of this name; None where nothing matches and there is no default."""
        if gpu_name is None:
            return None
        for key, price in self._models:
            if key.search(gpu_name):
                return price
        return self._default
