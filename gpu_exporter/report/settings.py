"""The ``report:`` section of the config file: how ``gpu-exporter report`` advises, as its flags set it.

The daemon's file serves both: the report reads its ``pricing`` (what cards cost) and ``report``
sections and nothing else; the daemon ignores ``report``. A flag given on the command line wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..accounting.settings import PricingSettings
from ..settings.durations import parse_duration
from ..settings.yamlfile import YamlFileError, clip, read_mapping, short

Duration = Annotated[float, BeforeValidator(parse_duration)]


class ReportSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow_slower: bool = Field(False, description="also show a cheaper card that would do the work more slowly")
    allow_consumer_cards: bool = Field(
        False, description="suggest GeForce cards too (NVIDIA's GeForce driver licence keeps them out of data centres)"
    )
    min_history: Duration = Field(86400.0, gt=0, description="the history a monthly figure needs (default 24h)")
    min_saving: float = Field(0.0, ge=0, allow_inf_nan=False, description="advise only what saves this much a month")
    min_saving_ratio: float = Field(
        0.2, ge=0, le=1, allow_inf_nan=False, description="advise only what saves this share of what the GPU costs"
    )
    recorded: Literal["auto", "yes", "no"] = Field(
        "auto",
        description="read the hourly series of alerts/gpu-report.rules.yml where they cover the range (auto), "
        "always (yes: fail where they do not), or never (no: the raw series)",
    )


class ReportConfigError(Exception):
    pass


def load(path: Path) -> tuple[ReportSettings, PricingSettings | None]:
    """The ``report`` and ``pricing`` sections of a config file; the others are the daemon's."""
    try:
        data = read_mapping(path, "config file") or {}
    except YamlFileError as e:
        raise ReportConfigError(str(e)) from e
    if not isinstance(data, dict):
        raise ReportConfigError(f"config file {path}: expected a mapping, got {type(data).__name__}")
    problems: list[str] = []
    report, pricing = ReportSettings(), None
    try:
        report = ReportSettings.model_validate(data.get("report") or {})
    except ValidationError as e:
        problems += [_problem("report", err) for err in e.errors()]
    try:
        pricing = PricingSettings.model_validate(data["pricing"]) if data.get("pricing") is not None else None
    except ValidationError as e:
        problems += [_problem("pricing", err) for err in e.errors()]
    if problems:
        raise ReportConfigError(clip(f"config file {path}: {'; '.join(problems)}"))
    return report, pricing


def _problem(section: str, err: Any) -> str:
    where = ".".join([section, *(str(p) for p in err["loc"])])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif "input" in err and not isinstance(err["input"], dict | list):
        msg = f"{msg} (got {short(err['input'])})"
    return f"{where}: {msg}"
