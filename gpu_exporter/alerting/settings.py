"""Settings of the alert rules and of alert delivery (the ``rules:`` and ``alerting:`` YAML keys).

Every rule is on by default except GpuIdle; any threshold or duration can be changed, and any
rule switched off with ``enabled: false``.  Unknown rules, negative durations and thresholds out
of range are refused by validation, so a typo never silently disables an alert.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..durations import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Ratio = Annotated[float, Field(ge=0, le=1)]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    enabled: bool = True
    for_: Duration = Field(300.0, alias="for", description="how long the condition must hold before firing")


class UnderutilizedRule(_Rule):
    for_: Duration = Field(1800.0, alias="for")
    window: Duration = Field(1800.0, gt=0, description="utilization is averaged over this window")
    threshold: Ratio = 0.10
    clear_threshold: Ratio = 0.15
    signal: Literal["auto", "gpu_utilization", "sm_active"] = Field(
        "auto",
        description="activity signal: SM activity (GPM) where the GPU has it, else GPU-Util (auto); or one of them",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> UnderutilizedRule:
        if self.clear_threshold < self.threshold:
            raise ValueError(f"clear_threshold {self.clear_threshold} must not be below threshold {self.threshold}")
        return self


class LowSmActivityRule(_Rule):
    """GPU-Util says busy while few SMs work: launch-bound code, tiny batches, one stream."""

    for_: Duration = Field(1800.0, alias="for")
    window: Duration = Field(1800.0, gt=0, description="both signals are averaged over this window")
    utilization_at_least: Ratio = 0.80
    sm_active_below: Ratio = 0.25
    clear_utilization_below: Ratio = 0.75
    clear_sm_active_above: Ratio = 0.30

    @model_validator(mode="after")
    def _hysteresis(self) -> LowSmActivityRule:
        if self.clear_utilization_below > self.utilization_at_least:
            raise ValueError("clear_utilization_below must not be above utilization_at_least")
        if self.clear_sm_active_above < self.sm_active_below:
            raise ValueError("clear_sm_active_above must not be below sm_active_below")
        return self


class IdleRule(_Rule):
    enabled: bool = False
    for_: Duration = Field(3600.0, alias="for")
    window: Duration = Field(3600.0, gt=0)
    threshold: Ratio = 0.01


class MemoryHighRule(_Rule):
    warning: Ratio = 0.90
    warning_clear: Ratio = 0.85
    critical: Ratio = 0.98
    critical_clear: Ratio = 0.95

    @model_validator(mode="after")
    def _levels(self) -> MemoryHighRule:
        if not self.warning_clear <= self.warning <= self.critical:
            raise ValueError("need warning_clear <= warning <= critical")
        if self.critical_clear > self.critical:
            raise ValueError("critical_clear must not be above critical")
        return self


class PcieBottleneckRule(_Rule):
    threshold: Ratio = Field(0.80, description="throughput / link capacity, either direction")
    clear_threshold: Ratio = 0.70
    utilization_below: Ratio = 0.50


class PcieLinkDegradedRule(_Rule):
    for_: Duration = Field(120.0, alias="for")
    min_utilization: Ratio = Field(0.20, description="only a GPU under load must run its link at full speed")


class LostRule(_Rule):
    for_: Duration = Field(30.0, alias="for")


class XidRule(_Rule):
    for_: Duration = Field(0.0, alias="for")
    codes: list[int] = Field(default_factory=lambda: [48, 63, 64, 74, 79, 92, 94, 95])
    window: Duration = Field(900.0, gt=0, description="an XID keeps the alert firing this long")


class ThermalThrottlingRule(_Rule):
    pass


class EccUncorrectableRule(_Rule):
    for_: Duration = Field(0.0, alias="for")
    window: Duration = Field(3600.0, gt=0, description="a new uncorrectable error keeps the alert firing this long")


class InstantRule(_Rule):
    for_: Duration = Field(0.0, alias="for")


class RulesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    GpuUnderutilized: UnderutilizedRule = UnderutilizedRule()
    GpuLowSmActivity: LowSmActivityRule = LowSmActivityRule()
    GpuIdle: IdleRule = IdleRule()
    GpuMemoryHigh: MemoryHighRule = MemoryHighRule()
    GpuPcieBottleneck: PcieBottleneckRule = PcieBottleneckRule()
    GpuPcieLinkDegraded: PcieLinkDegradedRule = PcieLinkDegradedRule()
    GpuLost: LostRule = LostRule()
    GpuXidError: XidRule = XidRule()
    GpuThermalThrottling: ThermalThrottlingRule = ThermalThrottlingRule()
    GpuEccUncorrectable: EccUncorrectableRule = EccUncorrectableRule()
    GpuRowRemapFailure: InstantRule = InstantRule()
    GpuRowRemapPending: InstantRule = InstantRule()


class ReceiverSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://", description="Alertmanager base URL, or the webhook's full URL")
    name: str | None = None
    timeout: Duration = Field(10.0, gt=0)
    basic_auth_username: str | None = None
    basic_auth_password: str | None = None
    bearer_token: str | None = None
    ca_file: str | None = None

    @model_validator(mode="after")
    def _one_auth(self) -> ReceiverSettings:
        if self.bearer_token and (self.basic_auth_username or self.basic_auth_password):
            raise ValueError("use basic auth or a bearer token, not both")
        return self

    @property
    def label(self) -> str:
        return self.name or self.url


class AlertingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alertmanagers: list[ReceiverSettings] = Field(default_factory=list)
    webhooks: list[ReceiverSettings] = Field(default_factory=list)
    resend_interval: Duration = Field(60.0, gt=0, description="firing alerts are re-sent this often")
    resolved_retention: Duration = Field(900.0, description="resolved alerts are re-sent for this long")
    queue_size: int = Field(10_000, ge=1, description="notifications held per receiver while it is down")
    external_url: str | None = Field(None, description="base URL of this daemon, for generatorURL")
