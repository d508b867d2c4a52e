"""The catalogue of cards and MIG profiles right-sizing can suggest (``catalogue.yaml``, or a user's).

Each card's rate per pipe, dense (no sparsity) at boost clock: ``fp16_tflops`` the FP16/BF16 tensor
cores with FP32 accumulate (the one every card has, and the measure of compute before GPM tells the
pipes apart), ``fp64_tflops``, ``fp32_tflops`` and ``fp16_vector_tflops`` the non-tensor pipes
GPM reports, where NVIDIA states them; its memory bandwidth; and its NVLink bandwidth.  A rate the
file leaves out is unknown, never 0: a job that uses that pipe is not sent to the card.  The
shipped file cites the source of each figure and carries no prices (a card is suggested only at a
price the user gives)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

GIB = 1024**3
# The pipes a job's demand is judged on: GPM's tensor, FP64, FP32 and FP16 (non-tensor) activity.
PIPES = ("tensor", "fp64", "fp32", "fp16")
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class CatalogueError(Exception):
    pass


class _Mig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = Field(pattern=r"^\d+g\.\d+gb$")
    slices: int = Field(ge=1, le=7, description="compute slices of the card's compute_slices")
    memory_gib: Positive


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    match: list[str] = Field(min_length=1, description="regular expressions, searched in NVML's GPU name")
    names: list[str] = Field(default_factory=list,
                             description="the card's names as NVML reports them: what a pricing key is matched "
                                         "against, as the daemon matches it")  # fmt: skip
    memory_gib: Positive
    fp16_tflops: Positive = Field(description="dense FP16/BF16 tensor TFLOPS with FP32 accumulate, no sparsity")
    fp64_tflops: Positive | None = Field(None, description="FP64 (non-tensor) TFLOPS; absent: unknown")
    fp32_tflops: Positive | None = Field(None, description="FP32 (non-tensor) TFLOPS; absent: unknown")
    fp16_vector_tflops: Positive | None = Field(None, description="FP16 (non-tensor) TFLOPS; absent: unknown")
    memory_bandwidth_gbps: Positive
    nvlink_gbps: float = Field(0.0, ge=0, allow_inf_nan=False,
                               description="NVLink bandwidth per GPU as NVIDIA states it (both directions "
                                           "together); 0: no NVLink")  # fmt: skip
    price_per_hour: float | None = Field(None, ge=0, allow_inf_nan=False, description="in the file's currency")
    consumer: bool = Field(False, description="a GeForce card: suggested only with --allow-consumer-cards")
    source: str | None = Field(None, description="where the figures come from")
    rates: str | None = Field(None, description="where the per-pipe rates and NVLink come from")
    mig: list[_Mig] = Field(default_factory=list)
    compute_slices: int = Field(7, ge=1, le=7, description="MIG compute slices the card has (7; 4 on an A30)")

    @model_validator(mode="after")
    def _slices_fit(self) -> _Card:
        if wide := [m.profile for m in self.mig if m.slices > self.compute_slices]:
            raise ValueError(f"mig profiles {wide} have more slices than the card's compute_slices "
                             f"({self.compute_slices})")  # fmt: skip
        return self

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
    slices: int = 7  # of the card's ``of_slices``: fewer for a MIG profile
    mig: bool = False
    consumer: bool = False
    # The non-tensor pipes' TFLOPS (None: unknown), and NVLink's bandwidth each way in GB/s (0: none;
    # a MIG slice has none, as MIG allows no peer-to-peer traffic between GPUs).
    fp64_tflops: float | None = None
    fp32_tflops: float | None = None
    fp16_vector_tflops: float | None = None
    nvlink_gbps_each_way: float = 0.0
    of_slices: int = 7  # the compute slices of the whole card (4 on an A30)

    def rate(self, pipe: str) -> float | None:
        """TFLOPS of one of PIPES; None where the catalogue does not say."""
        return {"tensor": self.fp16_tflops, "fp64": self.fp64_tflops, "fp32": self.fp32_tflops,
                "fp16": self.fp16_vector_tflops}[pipe]  # fmt: skip

    @property
    def share(self) -> float:
        return self.slices / self.of_slices

    @property
    def whole_card(self) -> bool:
        """The card itself, or a MIG profile of all of it: the same hardware at the same price."""
        return self.slices == self.of_slices


@dataclass(frozen=True)
class Catalogue:
    currency: str | None
    offers: tuple[Offer, ...]
    _patterns: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...]
    # Card -> its names as NVML reports them (``names``; a card without any is absent).
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)

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


def _part(rate: float | None, share: float) -> float | None:
    return None if rate is None else rate * share


def load_catalogue(path: Path | None = None) -> Catalogue:
    where = path or "catalogue.yaml (shipped)"
    try:
        # UTF-8 whatever the locale: a catalogue read as latin-1 would misread its names, not fail.
        shipped = files(__package__).joinpath("catalogue.yaml")
        text = path.read_text(encoding="utf-8") if path else shipped.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CatalogueError(f"cannot read the catalogue {where}: {reason}") from e
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
                            c.price_per_hour, slices=c.compute_slices, consumer=c.consumer,
                            fp64_tflops=c.fp64_tflops, fp32_tflops=c.fp32_tflops,
                            fp16_vector_tflops=c.fp16_vector_tflops, nvlink_gbps_each_way=c.nvlink_gbps / 2,
                            of_slices=c.compute_slices))  # fmt: skip
        for m in c.mig:
            # A slice has its share of the SMs (so of every pipe) and of the memory, the bandwidth of its
            # memory slices, and no NVLink.
            share = m.slices / c.compute_slices
            offers.append(Offer(
                f"{c.name} MIG {m.profile}", c.name, m.memory_gib * GIB, c.fp16_tflops * share,
                c.memory_bandwidth_gbps * min(1.0, m.memory_gib / c.memory_gib), _part(c.price_per_hour, share),
                m.slices, True, c.consumer, _part(c.fp64_tflops, share), _part(c.fp32_tflops, share),
                _part(c.fp16_vector_tflops, share), of_slices=c.compute_slices,
            ))  # fmt: skip
    patterns = tuple((c.name, tuple(re.compile(p, re.IGNORECASE) for p in c.match)) for c in doc.cards)
    catalogue = Catalogue(doc.currency.upper() if doc.currency else None, tuple(offers), patterns,
                          {c.name: tuple(c.names) for c in doc.cards if c.names})  # fmt: skip
    # A name is what the driver calls the card: it must be recognised as that card, or a price would
    # follow one card in the daemon and another in the report.
    for c in doc.cards:
        for name in c.names:
            if (found := catalogue.card_of(name)) is None or found.name != c.name:
                got = "no card" if found is None else found.name
                raise CatalogueError(f"catalogue {where}: {c.name}: its name {name!r} is recognised as {got} by the "
                                     "cards' match patterns (the first listed that matches wins)")  # fmt: skip
    return catalogue
