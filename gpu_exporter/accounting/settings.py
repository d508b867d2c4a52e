"""The ``pricing:`` and ``accounting:`` settings.

No price means no cost series: a GPU whose name matches no model and no ``default`` is left
without ``gpu_price_per_hour``, never given a made-up one.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..settings.durations import parse_duration

# What a currency label may be: the daemon takes no other, and the report leaves out a series from the
# store whose currency is not one (it was a CSV formula, a format string and a terminal escape).
CURRENCY = r"^[A-Za-z][A-Za-z0-9]{0,9}$"

Duration = Annotated[float, BeforeValidator(parse_duration)]
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class PricingSettings(BaseModel):
    """What the cards cost: per hour by GPU model, and energy per kWh, in one currency."""

    model_config = ConfigDict(extra="forbid")
    currency: str = Field(pattern=CURRENCY, description="e.g. USD, EUR; the currency label")
    models: dict[str, Price] = Field(
        default_factory=dict,
        description="price per hour by model: a key matches a GPU whose name holds it as a word "
        "(case-insensitive: 'L4' prices an L4, not an L40S); the longest matching key wins",
    )
    default: Price | None = Field(None, description="price per hour of a GPU no model key matches")
    energy_per_kwh: Price | None = Field(None, description="price of one kWh of energy")

    @field_validator("currency")
    @classmethod
    def _upper(cls, v: str) -> str:
        return v.upper()

    @field_validator("models")
    @classmethod
    def _keys(cls, v: dict[str, float]) -> dict[str, float]:
        blank = [k for k in v if not k.strip()]
        if blank:
            raise ValueError("a model key must name part of a GPU name, e.g. 'H100 80GB' or 'L4'")
        lowered = [k.strip().lower() for k in v]
        twice = sorted({k for k in lowered if lowered.count(k) > 1})
        if twice:
            raise ValueError(f"model keys {twice} are given twice (keys match case-insensitively)")
        return {k.strip(): p for k, p in v.items()}

    @model_validator(mode="after")
    def _something(self) -> PricingSettings:
        if not self.models and self.default is None and self.energy_per_kwh is None:
            raise ValueError("pricing needs at least one of models, default or energy_per_kwh")
        return self


class AccountingSettings(BaseModel):
    """How the daemon keeps GPU time (the ``accounting:`` key)."""

    model_config = ConfigDict(extra="forbid")
    memory_peak_window: Duration = Field(
        300.0, gt=0, le=86400, description="gpu_memory_used_max_bytes is the highest used memory over this window"
    )
    max_users: int = Field(
        20,
        ge=1,
        le=1000,
        description="holders per GPU other than pods (users, Slurm jobs, containers) with series of their own; "
        "further ones count as one 'other' of their kind",
    )
    holder_retention: Duration = Field(
        3600.0, gt=0, description="a holder's time series leave /metrics this long after it last held the GPU"
    )
