"""The catalogue of cards and MIG profiles right-sizing can suggest (``catalogue.yaml``, or a user's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

GIB = 1024**3
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class CatalogueError(Exception):
    pass


class _Mig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = Field(pattern=r"^\d+g\.\d+gb$")
    slices: int = Field(ge=1, le=7, description="compute slices of the 7 a GPU has")
    memory_gib: Positive


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    match: list[str] = Field(min_length=1, description="regular expressions, searched in NVML's GPU name")
    memory_gib: Positive
    fp16_tflops: Positive
    fp32_tflops: Positive
    memory_bandwidth_gbps: Positive
    price_per_hour: float | None = Field(None, ge=0)
    mig: list[_Mig] = Field(default_factory=list)

    @field_validator("match")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"match {pattern!r} is not a regular expression: {e}") from e
        return v


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    currency: str | None = Field(None, description="currency of price_per_hour")
    cards: list[_Card] = Field(min_length=1)


@dataclass(frozen=True)
class Offer:
    """A card, or a MIG profile of one, that a job could run on."""

    name: str  # "L4", "A100 80GB MIG 1g.20gb"
    card: str  # the card it is or is part of
    memory_bytes: float
    fp16_tflops: float
    fp32_tflops: float
    memory_bandwidth_gbps: float
    reference_price_per_hour: float | None
    share: float = 1.0  # of the card: slices / 7 for a MIG profile

    @property
    def is_mig(self) -> bool:
        return self.share < 1.0 or "MIG" in self.name


@dataclass(frozen=True)
class Catalogue:
    currency: str | None
    offers: tuple[Offer, ...]
    _patterns: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...]

    def card_of(self, gpu_name: str) -> Offer | None:
        """The whole card whose patterns match NVML's name for a GPU; the first listed wins."""
        for card, patterns in self._patterns:
            if any(p.search(gpu_name) for p in patterns):
                return next(o for o in self.offers if o.name == card)
        return None


def load_catalogue(path: Path | None = None) -> Catalogue:
    try:
        text = path.read_text() if path else files(__package__).joinpath("catalogue.yaml").read_text()
    except OSError as e:
        raise CatalogueError(f"cannot read the catalogue {path}: {e.strerror or e}") from e
    try:
        doc = _File.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as e:
        raise CatalogueError(f"catalogue {path} is not valid YAML: {e}") from e
    except ValidationError as e:
        where = path or "catalogue.yaml"
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise CatalogueError(f"catalogue {where}: {problems}") from e
    offers: list[Offer] = []
    for c in doc.cards:
        offers.append(Offer(c.name, c.name, c.memory_gib * GIB, c.fp16_tflops, c.fp32_tflops,
                            c.memory_bandwidth_gbps, c.price_per_hour))  # fmt: skip
        for m in c.mig:
            share = m.slices / 7
            offers.append(Offer(
                f"{c.name} MIG {m.profile}", c.name, m.memory_gib * GIB, c.fp16_tflops * share, c.fp32_tflops * share,
                c.memory_bandwidth_gbps * m.memory_gib / c.memory_gib,
                None if c.price_per_hour is None else c.price_per_hour * share, share,
            ))  # fmt: skip
    patterns = tuple((c.name, tuple(re.compile(p, re.IGNORECASE) for p in c.match)) for c in doc.cards)
    return Catalogue(doc.currency.upper() if doc.currency else None, tuple(offers), patterns)
