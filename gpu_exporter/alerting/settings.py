"""Settings of the alert rules and of alert delivery (the ``rules:`` and ``alerting:`` YAML keys).

Every rule is on by default except GpuIdle; any threshold or duration can be changed, and any
rule switched off with ``enabled: false``.  Unknown rules, negative durations, durations and
thresholds out of a sane range and receiver URLs that cannot work are refused by validation, so a
typo never silently disables an alert and no setting fails later, at send time.

A threshold with a clear threshold (``warning`` and ``warning_clear``, ``threshold`` and
``clear_threshold``, ...) is declared once as a :class:`Hysteresis` pair, and one validator treats
every pair alike: a clear left out follows its threshold at the defaults' distance, and one set past
its threshold, where the alert would fire and clear at once and flap, is refused.  docs/alerts.md's
table of rules is written from these models and :data:`RULE_DOCS` (``docs/generate.py``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from ..settings.durations import parse_duration
from ..settings.yamlfile import MAX_SECRET_BYTES, read_bounded
from .xid_catalogue import operator_xids

DAY = 86_400.0
# Far beyond any sensible rule window or delivery interval, and far inside what a timestamp can
# hold: 4 x resend_interval is added to "now" for every firing alert.
MAX_DURATION_S = 30 * DAY

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=MAX_DURATION_S)]
Ratio = Annotated[float, Field(ge=0, le=1)]


@dataclass(frozen=True)
class Hysteresis:
    """A threshold and the clear threshold that ends its alert.  ``high``: the alert fires above
    ``threshold`` and clears below ``clear``, so ``clear`` must not be above ``threshold``; else the
    other way round.  Equal is taken: no hysteresis, as a plain Prometheus rule has."""

    threshold: str
    clear: str
    high: bool

    def gap(self, rule: type[_Rule]) -> float:
        """How far the defaults put the clear from the threshold."""
        fields = rule.model_fields
        return round(abs(float(fields[self.threshold].default) - float(fields[self.clear].default)), 9)

    def following(self, rule: type[_Rule], threshold: float) -> float:
        """The clear of ``threshold`` where none is set: the defaults' gap away, within 0 to 1."""
        gap = self.gap(rule)
        return min(1.0, max(0.0, round(threshold - gap if self.high else threshold + gap, 9)))

    def refusal(self, rule: type[_Rule], threshold: float, clear: float) -> str | None:
        """Why ``clear`` cannot go with ``threshold``, and what to set instead; None where it can."""
        if (clear <= threshold) if self.high else (clear >= threshold):
            return None
        side, most, least = ("above", "less", "more") if self.high else ("below", "more", "less")
        return (
            f"{self.clear} {clear:g} is {side} {self.threshold} {threshold:g}, so the alert would flap (a value "
            f"between the two both fires and clears it); set {self.clear} to {threshold:g} or {most}, "
            f"or {self.threshold} to {clear:g} or {least} (left out, {self.clear} follows {self.threshold}, "
            f"{self.gap(rule):g} {'below' if self.high else 'above'} it)"
        )


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    # Each threshold and its clear threshold; and (lower, higher) keys that must stay in that order.
    hysteresis: ClassVar[tuple[Hysteresis, ...]] = ()
    ordered: ClassVar[tuple[tuple[str, str], ...]] = ()
    enabled: bool = True
    for_: Duration = Field(300.0, alias="for", description="how long the condition must hold before firing")

    @model_validator(mode="after")
    def _clears_where_they_can(self) -> Self:
        """Every pair of every rule, by one rule: a clear left out follows its threshold; one set past
        it is refused, naming both keys, their values and what to set (all problems at once)."""
        rule = type(self)
        problems = []
        for h in self.hysteresis:
            threshold = getattr(self, h.threshold)
            if h.clear not in self.model_fields_set:
                if h.threshold in self.model_fields_set:
                    setattr(self, h.clear, h.following(rule, threshold))
                continue
            if (why := h.refusal(rule, threshold, getattr(self, h.clear))) is not None:
                problems.append(why)
        for lower, higher in self.ordered:
            low, high = getattr(self, lower), getattr(self, higher)
            if low > high:
                problems.append(f"{lower} {low:g} is above {higher} {high:g}: set {higher} to {low:g} or more, "
                                f"or {lower} to {high:g} or less")  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
        return self


class UnderutilizedRule(_Rule):
    for_: Duration = Field(1800.0, alias="for")
    window: Duration = Field(1800.0, gt=0, description="utilization is averaged over this window")
    threshold: Ratio = 0.10
    clear_threshold: Ratio = 0.15
    signal: Literal["auto", "gpu_utilization", "sm_active"] = Field(
        "auto",
        description="activity signal: SM activity (GPM) where the GPU has it, else GPU-Util (auto); or one of them",
    )
    hysteresis = (Hysteresis("threshold", "clear_threshold", high=False),)


class LowSmActivityRule(_Rule):
    """GPU-Util says busy while few SMs work: launch-bound code, tiny batches, one stream."""

    for_: Duration = Field(1800.0, alias="for")
    window: Duration = Field(1800.0, gt=0, description="both signals are averaged over this window")
    utilization_at_least: Ratio = 0.80
    sm_active_below: Ratio = 0.25
    clear_utilization_below: Ratio = 0.75
    clear_sm_active_above: Ratio = 0.30
    hysteresis = (
        Hysteresis("utilization_at_least", "clear_utilization_below", high=True),
        Hysteresis("sm_active_below", "clear_sm_active_above", high=False),
    )


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
    hysteresis = (
        Hysteresis("warning", "warning_clear", high=True),
        Hysteresis("critical", "critical_clear", high=True),
    )
    ordered = (("warning", "critical"),)


class PcieBottleneckRule(_Rule):
    threshold: Ratio = Field(0.80, description="throughput / link capacity, either direction")
    clear_threshold: Ratio = 0.70
    utilization_below: Ratio = 0.50
    hysteresis = (Hysteresis("threshold", "clear_threshold", high=True),)


class PcieLinkDegradedRule(_Rule):
    for_: Duration = Field(120.0, alias="for")
    min_utilization: Ratio = Field(0.20, description="only a GPU under load must run its link at full speed")


class LostRule(_Rule):
    for_: Duration = Field(30.0, alias="for")


class XidRule(_Rule):
    for_: Duration = Field(0.0, alias="for")
    # NVIDIA's XID catalogue (alerting.xid_catalogue): each XID whose Immediate Action needs the
    # operator (reset, reboot, a workflow, support), not those an application restart or nothing settles.
    codes: list[int] = Field(default_factory=operator_xids)
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
    GpuRecoveryRequired: InstantRule = InstantRule()
    GpuResetRequired: InstantRule = InstantRule()
    GpuFabricUnhealthy: InstantRule = InstantRule(**{"for": 60.0})  # route and timeout recoveries pass
    GpuFabricNotReady: InstantRule = InstantRule(**{"for": 300.0})  # registration takes a while at boot


@dataclass(frozen=True)
class RuleDoc:
    """One row of docs/alerts.md's table of rules.  ``{key}`` in ``fires`` and ``clears`` is written as the
    key's default and the key, ``0.9 (`warning`)``: each default is written in one place, the model."""

    severity: str
    fires: str
    clears: str


RULE_DOCS: dict[str, RuleDoc] = {
    "GpuUnderutilized": RuleDoc(
        "warning",
        "a process holds GPU memory but activity averaged over {window} is below {threshold}; {signal} takes SM "
        "activity where the GPU has GPM, else GPU-Util (or `sm_active`, `gpu_utilization`)",
        "average above {clear_threshold}, or no process holds memory"),
    "GpuLowSmActivity": RuleDoc(
        "warning",
        "GPU-Util averaged over {window} at least {utilization_at_least} while SM activity (GPM) stays below "
        "{sm_active_below}",
        "GPU-Util below {clear_utilization_below} or SM activity above {clear_sm_active_above}"),
    "GpuIdle": RuleDoc(
        "info", "no processes and utilization averaged over {window} below {threshold}",
        "a process appears, or utilization reaches the threshold"),
    "GpuMemoryHigh": RuleDoc(
        "warning / critical", "used / total memory above {warning} / {critical}",
        "below {warning_clear} / {critical_clear}"),
    "GpuPcieBottleneck": RuleDoc(
        "warning",
        "PCIe throughput in either direction at least {threshold} of `gpu_pcie_link_max_bytes_per_second` while "
        "utilization is below {utilization_below}",
        "below {clear_threshold}, or utilization at least `utilization_below`"),
    "GpuPcieLinkDegraded": RuleDoc(
        "warning",
        "link generation or width below the card's maximum while utilization is at least {min_utilization}; idle "
        "cards legitimately train down",
        "link back at maximum, or utilization below `min_utilization`"),
    "GpuLost": RuleDoc(
        "critical", "the GPU does not answer, or the driver no longer lists a GPU seen since the start",
        "it answers (a restart forgets a GPU removed for good)"),
    "GpuXidError": RuleDoc(
        "critical", "an XID (label `xid`) from {codes} within the last {window}", "a `window` without one"),
    "GpuThermalThrottling": RuleDoc("warning", "hardware or software thermal slowdown active", "inactive"),
    "GpuEccUncorrectable": RuleDoc(
        "critical", "uncorrectable ECC errors rose within the last {window}", "a `window` without a new one"),
    "GpuRowRemapFailure": RuleDoc("critical", "a row remap failed", "the flag clears"),
    "GpuRowRemapPending": RuleDoc("warning", "a row remap is pending (reset the GPU)", "the flag clears"),
    "GpuRecoveryRequired": RuleDoc(
        "critical", "the driver asks for a recovery action (`gpu_recovery_action` above 0, driver 565+); the summary "
        "says which: reset the GPU, reboot, drain", "the action is 0"),
    "GpuResetRequired": RuleDoc(
        "critical", "the GPU answers its queries with NVML_ERROR_RESET_REQUIRED (`gpu_reset_required`)",
        "it answers them again"),
    "GpuFabricUnhealthy": RuleDoc(
        "critical", "the NVLink fabric reports an issue (`gpu_fabric_issue` 1, label `issue`; NVSwitch and GB200 "
        "systems, driver 550+); the summary says what to do", "the issue is reported gone"),
    "GpuFabricNotReady": RuleDoc(
        "critical", "the GPU has not completed its fabric registration (`gpu_fabric_state` below 3)",
        "the registration completes"),
}  # fmt: skip


def _is_duration(field: FieldInfo) -> bool:
    return any(isinstance(m, BeforeValidator) and m.func is parse_duration for m in field.metadata)


def _written(value: Any, duration: bool) -> str:
    """A default as it would be written in the config: ``0.9``, ``30m``, ``48, 63``, ``auto``."""
    if duration:
        for unit, seconds in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
            if value >= seconds and value % seconds == 0:
                return f"{value / seconds:g}{unit}"
        return f"{value:g}s"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def rules_table() -> str:
    """docs/alerts.md's table of rules: every key of every rule, with its default."""
    rows = ["| alert | severity | fires when (default `key`) | `for` | clears when |", "|---|---|---|---|---|"]
    defaults = RulesSettings()
    for alertname in RulesSettings.model_fields:
        rule: _Rule = getattr(defaults, alertname)
        doc = RULE_DOCS[alertname]
        fields = type(rule).model_fields
        shown = {name: f"{_written(getattr(rule, name), _is_duration(f))} (`{name}`)" for name, f in fields.items()}
        off = "" if rule.enabled else " (off by default)"
        rows.append(f"| `{alertname}`{off} | {doc.severity} | {doc.fires.format_map(shown)} | "
                    f"{_written(rule.for_, duration=True)} | {doc.clears.format_map(shown)} |")  # fmt: skip
    return "\n".join(rows) + "\n"


# What http.client refuses anywhere in a URL (it raises InvalidURL at send time).
_UNSENDABLE = re.compile(r"[\x00-\x20\x7f]")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def receiver_url(url: str) -> str:
    """The URL as given, if an HTTP request can be sent to it; else a ValueError saying why."""
    if _UNSENDABLE.search(url):
        raise ValueError("a URL cannot hold spaces or control characters (percent-encode them)")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as e:
        raise ValueError(f"not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are not sent; use basic_auth_username and basic_auth_password")
    host = parts.hostname
    if not host:
        raise ValueError("the URL has no host")
    if port == 0:
        raise ValueError("port 0 cannot be connected to")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(_HOST_LABEL.match(label) for label in host.removesuffix(".").split(".")):
            try:
                host.encode("idna")
            except UnicodeError:
                raise ValueError(f"{host!r} is not a valid host name") from None
    return url


ReceiverUrl = Annotated[str, AfterValidator(receiver_url)]
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def group_by_labels(names: list[str]) -> list[str]:
    if "..." in names and len(names) > 1:
        raise ValueError("'...' (group by every label) cannot be combined with label names")
    bad = [n for n in names if n != "..." and not _LABEL_NAME.match(n)]
    if bad:
        raise ValueError(f"not label names: {bad}")
    if len(set(names)) != len(names):
        raise ValueError(f"a label is listed twice: {names}")
    return names


def _secret_text(value: str, what: str) -> str:
    """A secret as read from YAML or a file: surrounding whitespace (a Secret file's final newline,
    YAML's ``|``) stripped; whitespace or control characters inside refused, without echoing it."""
    value = value.strip()
    if not value:
        raise ValueError(f"the {what} is empty")
    if _UNSENDABLE.search(value):
        raise ValueError(f"the {what} holds whitespace or control characters inside (the value is not shown)")
    return value


def _read_secret_file(path: Path, what: str) -> str:
    try:
        raw = read_bounded(path, MAX_SECRET_BYTES)
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {str(path)!r}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the {what} file {str(path)!r} is not UTF-8 text") from None


def receiver_origin(url: str) -> str:
    """``scheme://host[:port]`` of a receiver URL: its name where none is given.  The path and query are
    left out, as Slack- and Discord-style webhooks carry their secret there."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


class ReceiverSettings(BaseModel):
    """Where alerts go.  Secrets (the bearer token, the basic-auth password and, for webhooks whose URL
    is a secret, the URL) can come from files (``*_file``), read at start and on every SIGHUP, and are
    never shown: not in errors, logs, ``--once`` JSON or metric labels."""

    model_config = ConfigDict(extra="forbid")
    url: ReceiverUrl = Field(description="Alertmanager base URL, or the webhook's full URL")
    url_file: Path | None = Field(None, description="a file holding the URL, for webhooks whose URL is a secret")
    name: str | None = Field(None, min_length=1)
    timeout: Duration = Field(10.0, gt=0, le=300)
    basic_auth_username: str | None = None
    basic_auth_password: SecretStr | None = None
    basic_auth_password_file: Path | None = None
    bearer_token: SecretStr | None = None
    bearer_token_file: Path | None = None
    ca_file: str | None = None
    _label: str | None = PrivateAttr(None)  # set by AlertingSettings where names must be made unique

    @model_validator(mode="before")
    @classmethod
    def _from_files(cls, data: Any) -> Any:
        """Each ``*_file`` read into its setting (one or the other, not both)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, what in (("url", "URL"), ("bearer_token", "bearer token"), ("basic_auth_password", "password")):
            path = data.get(f"{key}_file")
            if path is None:
                continue
            if data.get(key) is not None:
                raise ValueError(f"set {key} or {key}_file, not both")
            data[key] = _read_secret_file(Path(path), what).strip()
        return data

    @field_validator("bearer_token", "basic_auth_password", mode="before")
    @classmethod
    def _clean_secret(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or isinstance(value, SecretStr):
            return value
        what = "bearer token" if info.field_name == "bearer_token" else "password"
        if not isinstance(value, str):
            raise ValueError(f"the {what} must be a string (quote it in YAML; the value is not shown)")
        return _secret_text(value, what)

    @model_validator(mode="after")
    def _one_auth(self) -> ReceiverSettings:
        if self.bearer_token and (self.basic_auth_username or self.basic_auth_password):
            raise ValueError("use basic auth or a bearer token, not both")
        return self

    @property
    def label(self) -> str:
        """The receiver's name in metrics and logs: as configured, else the URL's scheme, host and port."""
        return self._label or self.name or receiver_origin(self.url)


class WebhookSettings(ReceiverSettings):
    """A webhook fed directly, routed as an Alertmanager route with these settings would route it."""

    group_by: Annotated[list[str], AfterValidator(group_by_labels)] = Field(
        default_factory=lambda: ["alertname", "node"], description="alerts with equal values of these go together"
    )
    group_wait: Duration = Field(30.0, le=3600, description="how long a new group waits for more alerts")
    group_interval: Duration = Field(300.0, gt=0, le=DAY, description="how long between notifications of a group")
    repeat_interval: Duration = Field(4 * 3600.0, gt=0, description="how long before an unchanged group is re-sent")
    send_resolved: bool = True
    max_concurrent_requests: int = Field(
        4, ge=1, le=64,
        description="requests in flight at once to this webhook, each for another group; past one, one place is kept "
        "for groups with a firing critical alert",
    )  # fmt: skip

    @property
    def receiver(self) -> str:
        """The ``receiver`` field of the payload, as Alertmanager fills it with the receiver's name."""
        return self.name or "webhook"


class AlertingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alertmanagers: list[ReceiverSettings] = Field(default_factory=list)
    webhooks: list[WebhookSettings] = Field(default_factory=list)
    resend_interval: Duration = Field(60.0, gt=0, le=DAY, description="firing alerts are re-sent this often")
    resolved_retention: Duration = Field(900.0, le=7 * DAY, description="resolved alerts are re-sent for this long")
    queue_size: int = Field(10_000, ge=1, le=1_000_000, description="alerts held per receiver while it is down")
    external_url: ReceiverUrl | None = Field(None, description="base URL of this daemon, for generatorURL")

    @model_validator(mode="after")
    def _unique_labels(self) -> AlertingSettings:
        """Receivers named after the same host get a number each, so their series stay apart."""
        receivers: list[ReceiverSettings] = [*self.alertmanagers, *self.webhooks]
        labels = [r.name or receiver_origin(r.url) for r in receivers]
        seen: dict[str, int] = {}
        for r, label in zip(receivers, labels, strict=True):
            if labels.count(label) > 1 and r.name is None:
                seen[label] = seen.get(label, 0) + 1
                r._label = f"{label} #{seen[label]}"
        return self
