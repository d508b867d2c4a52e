"""Prices of GPUs by name, from the ``pricing:`` settings."""

from __future__ import annotations

from .settings import PricingSettings


class PriceBook:
    def __init__(self, settings: PricingSettings) -> None:
        self.currency = settings.currency
        self.energy_per_kwh = settings.energy_per_kwh
        self._default = settings.default
        # Longest key first, so "H100 NVL" wins over "H100" for an "NVIDIA H100 NVL".
        self._models = sorted(((k.lower(), p) for k, p in settings.models.items()), key=lambda kp: -len(kp[0]))

    def per_hour(self, gpu_name: str | None) -> float | None:
        """The price per hour of a GPU of this name; None where nothing matches and there is no default."""
        if gpu_name is None:
            return None
        name = gpu_name.lower()
        for key, price in self._models:
            if key in name:
                return price
        return self._default
