"""The catalogue of cards and MIG profiles right-sizing can suggest (``catalogue.yaml``, or a user's).

Throughput is one measure across the catalogue (``fp16_tflops``: dense FP16/BF16 tensor with FP32
accumulate, no sparsity), so that cards compare; the shipped file cites the source of each figure
and carries no prices (a card is suggested only at a price the user gives)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

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
    fp16_tflops: Positive = Field(description="dense FP16/BF16 tensor TFLOPS with FP32 accumulate, no sparsity")
    fp32_tflops: Positive | None = Field(None, description="not used: kept so that older catalogues still load")
    memory_bandwidth_gbps: Positive
    price_per_hour: float | None = Field(None, ge=0, allow_inf_nan=False, description="in the file's currency")
    consumer: bool = Field(False, description="a GeForce card: suggested only with --allow-consumer-cards")
    source: str | None = Field(None, description="where the figures come from")
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
    memory_bandwidth_gbps: float
    price_per_hour: float | None  # the catalogue's own, in its currency: only a user's catalogue has one
    slices: int = 7  # of the card's 7: fewer for a MIG profile
    mig: bool = False
    consumer: bool = False

    @property
    def share(self) -> float:
        return self.slices / 7

    @property
    def whole_card(self) -> bool:
        """The card itself, or a MIG profile of all of it: the same hardware at the same price."""
        return self.slices == 7


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


def _problem(err: Any, raw: Any) -> str:
    """One validation error as the file's author would find it: 'cards[2] (L4): memory_gib: ...'."""
    loc: list[str | int] = list(err["loc"])
    where = ""
    if len(loc) >= 2 and loc[0] == "cards" and isinstance(loc[1], int):
        card = raw["cards"][loc[1]] if isinstance(raw.get("cards"), list) and len(raw["cards"]) > loc[1] else None
        name = card.get("name") if isinstance(card, dict) else None
        where = f"cards[{loc[1]}]" + (f" ({name})" if isinstance(name, str) and name else "")
        loc = loc[2:]
    key = ".".join(f"[{p}]" if isinstance(p, int) else p for p in loc).replace(".[", "[")
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        msg = "missing"
    elif err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif "input" in err and not isinstance(err["input"], dict | list):
        msg = f"{msg} (got {err['input']!r})"
    return ": ".join(x for x in (where, key, msg) if x)


def load_catalogue(path: Path | None = None) -> Catalogue:
    where = path or "catalogue.yaml (shipped)"
    try:
        text = path.read_text() if path else files(__package__).joinpath("catalogue.yaml").read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CatalogueError(f"cannot read the catalogue {path}: {reason}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise CatalogueError(f"catalogue {where} is not valid YAML{at}: {problem}") from e
    if not isinstance(raw, dict):
        got = "nothing" if raw is None else f"a {type(raw).__name__}"
        raise CatalogueError(f"catalogue {where}: expected a mapping with 'currency' and 'cards', got {got}")
    try:
        doc = _File.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(_problem(err, raw) for err in e.errors())
        raise CatalogueError(f"catalogue {where}: {problems}") from e
    offers: list[Offer] = []
    names = [c.name for c in doc.cards]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise CatalogueError(f"catalogue {where}: cards {twice} are listed twice")
    for c in doc.cards:
        offers.append(Offer(c.name, c.name, c.memory_gib * GIB, c.fp16_tflops, c.memory_bandwidth_gbps,
                            c.price_per_hour, consumer=c.consumer))  # fmt: skip
        for m in c.mig:
            # A slice has its share of the SMs and of the memory, and the bandwidth of its memory slices.
            offers.append(Offer(
                f"{c.name} MIG {m.profile}", c.name, m.memory_gib * GIB, c.fp16_tflops * m.slices / 7,
                c.memory_bandwidth_gbps * min(1.0, m.memory_gib / c.memory_gib),
                None if c.price_per_hour is None else c.price_per_hour * m.slices / 7, m.slices, True, c.consumer,
            ))  # fmt: skip
    patterns = tuple((c.name, tuple(re.compile(p, re.IGNORECASE) for p in c.match)) for c in doc.cards)
    return Catalogue(doc.currency.upper() if doc.currency else None, tuple(offers), patterns)
