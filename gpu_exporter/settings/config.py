"""Settings: CLI flags > environment (GPU_EXPORTER_*) > YAML file (--config) > defaults.

Any bad value, unknown key or unreadable file raises ConfigError, whose message names the
setting (or environment variable, or file), the value and what is allowed, in a few lines
whatever the input; the CLI turns it into exit status 2.  Files that settings name (a receiver's
``ca_file``) are opened here too, so the daemon and ``--once`` refuse the same input.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ..accounting.settings import AccountingSettings, PricingSettings
from ..alerting.settings import AlertingSettings, RulesSettings
from ..metric_defs import COLLECTOR_HELP, OWN_LABELS, Collector
from ..report.settings import ReportSettings
from ..web.address import parse_listen_address
from .durations import parse_duration
from .redaction import is_secret_key, redact_text, redacted
from .yamlfile import YamlFileError, clip, read_mapping, short

DEFAULT_PORT = 9445
ENV_PREFIX = "GPU_EXPORTER_"
# dcgm-exporter's flag and environment variable for a setting of ours, so that a unit or manifest
# written for it keeps working: setting path -> (flag, environment variable).  The flag ranks as a
# flag; the variable below ours (GPU_EXPORTER_SLURM__JOB_MAPPING_DIR) and above the file, and empty
# is unset, as in dcgm-exporter.
DCGM_NAMES: dict[tuple[str, ...], tuple[str, str]] = {
    ("slurm", "job_mapping_dir"): ("--hpc-job-mapping-dir", "DCGM_HPC_JOB_MAPPING_DIR"),
}


class ConfigError(Exception):
    pass


Duration = Annotated[float, BeforeValidator(parse_duration)]


_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_OWN_LABELS = OWN_LABELS  # every label of the declared metrics (and the alerts' node)


class KubernetesSettings(BaseModel):
    """Pod attribution from the kubelet's PodResources API (the ``kubernetes:`` YAML key)."""

    model_config = ConfigDict(extra="forbid")
    pod_attribution: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on when the socket exists at start or when running in a pod"
    )
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    refresh_interval: Duration = Field(10.0, gt=0)
    timeout: Duration = Field(5.0, gt=0)
    keep_last_good_for: Duration = Field(
        300.0, gt=0, le=86_400, description="how long pod labels outlive the kubelet's last successful answer"
    )
    # nvidia.com/gpu.shared: the device plugin's name for time-sliced GPUs with renameByDefault.
    resource_names: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/gpu.shared"])
    resource_prefixes: list[str] = Field(default_factory=lambda: ["nvidia.com/mig-"])
    namespace_label: str = Field("namespace", pattern=_LABEL_NAME)
    pod_label: str = Field("pod", pattern=_LABEL_NAME)
    container_label: str = Field("container", pattern=_LABEL_NAME)

    @model_validator(mode="after")
    def _distinct(self) -> KubernetesSettings:
        names = [self.namespace_label, self.pod_label, self.container_label]
        if len(set(names)) != 3:
            raise ValueError(f"the namespace, pod and container label names must differ, got {names}")
        clash = set(names) & _OWN_LABELS
        if clash:
            raise ValueError(f"label name(s) {sorted(clash)} are already used by the exporter's own series")
        return self

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.namespace_label, self.pod_label, self.container_label)

    def enabled(self) -> bool:
        if self.pod_attribution != "auto":
            return self.pod_attribution == "on"
        return os.path.exists(self.pod_resources_socket) or "KUBERNETES_SERVICE_HOST" in os.environ


class SlurmSettings(BaseModel):
    """Slurm jobs as GPU holders (the ``slurm:`` key): off until a source is set."""

    model_config = ConfigDict(extra="forbid")
    job_mapping_dir: str | None = Field(
        None, description="dcgm-exporter's --hpc-job-mapping-dir: one file per GPU index (or <gpu>.<gpu instance "
        "id>), each line a job ID, written by Slurm's prolog",
    )  # fmt: skip
    job_from_cgroup: bool = Field(
        False, description="the job of each GPU process from its cgroup (Slurm's cgroup plugin)"
    )
    keep_last_good_for: Duration = Field(
        300.0, gt=0, le=86_400, description="how long jobs read from a mapping file outlive the file's last good read"
    )

    @field_validator("job_mapping_dir")
    @classmethod
    def _directory(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or (os.path.exists(v) and not os.path.isdir(v))):
            raise ValueError(f"{v!r} is not a directory")
        return v

    def enabled(self) -> bool:
        return self.job_mapping_dir is not None or self.job_from_cgroup


class ContainerSettings(BaseModel):
    """Docker, Podman, containerd and CRI-O containers as GPU holders (the ``containers:`` key)."""

    model_config = ConfigDict(extra="forbid")
    attribution: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on where a Docker or Podman socket exists at start and pod attribution is off "
        "(on Kubernetes, pods hold the GPUs)",
    )  # fmt: skip
    docker_socket: str = Field("/var/run/docker.sock", description="container names from Docker's API; '' for none")
    podman_socket: str = Field("/run/podman/podman.sock", description="container names from Podman's API; '' for none")
    api_timeout: Duration = Field(1.0, gt=0, le=30, description="the longest one name lookup may take")
    api_retry_after: Duration = Field(60.0, gt=0, le=86_400, description="how long an engine that failed is left alone")
    name_cache_size: int = Field(1024, ge=1, le=1_000_000, description="container names remembered")

    @field_validator("attribution", mode="before")
    @classmethod
    def _yaml_booleans(cls, v: object) -> object:
        """YAML reads an unquoted on/off as a boolean."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    def enabled(self, pods: bool) -> bool:
        if self.attribution != "auto":
            return self.attribution == "on"
        return not pods and any(path and os.path.exists(path) for path in (self.docker_socket, self.podman_socket))


class _CollectorSwitches(BaseModel):
    """Which groups of series are collected (the ``collectors:`` key; ``--[no-]collector.<name>``).

    A collector that is off costs nothing: its series are absent and its NVML queries are not made.
    One boolean per collector of :mod:`gpu_exporter.metric_defs`, where they are declared.
    """

    model_config = ConfigDict(extra="forbid")

    def disabled(self) -> frozenset[str]:
        return frozenset(name for name, on in self.model_dump().items() if not on)


if TYPE_CHECKING:
    CollectorSettings = _CollectorSwitches
else:  # the fields come from the declarations, so a new collector needs no edit here
    CollectorSettings = create_model(
        "CollectorSettings",
        __base__=_CollectorSwitches,
        **{c.value: (bool, Field(True, description=text)) for c, text in COLLECTOR_HELP.items()},
    )
COLLECTORS = tuple(CollectorSettings.model_fields)
# Rules that would misjudge without a collector's data: switched off with it.  GpuIdle means "no
# processes and low utilization", GpuUnderutilized "processes hold memory, activity low"; without
# the process list neither can tell.  The others just have nothing to say (no data, no alert).
RULES_NEEDING = {"GpuIdle": Collector.PROCESSES, "GpuUnderutilized": Collector.PROCESSES}


def _renamed(key: str, old: str) -> AliasChoices:
    """A setting read under ``key``, its name by the rule, and ``old``, the name it had before."""
    return AliasChoices(key, old)


class Settings(BaseSettings):
    # env_prefix_target "all": a key given as an alias is read as GPU_EXPORTER_<KEY> too, never as
    # a bare <KEY> (pydantic-settings' default, which would read any LISTEN_ADDRESS of the host).
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_prefix_target="all", env_nested_delimiter="__", extra="forbid",
        validate_default=True,
    )  # fmt: skip

    # The key is the flag's (--web.listen-address, web_listen_address), and so is the attribute; the old
    # name is still read as a key (and variable) so that no file written for it breaks.
    web_listen_address: str = Field(
        f":{DEFAULT_PORT}", validation_alias=_renamed("web_listen_address", "listen_address"),
        description="address to serve /metrics on",
    )  # fmt: skip
    web_config_file: Path | None = Field(
        None, description="exporter-toolkit web config (TLS, mTLS, basic auth, headers); re-read when it changes"
    )
    web_max_requests: int = Field(40, ge=1, le=10_000, description="requests served at once; beyond, 503")
    poll_interval: Duration = Field(5.0, gt=0, le=3600, description="time between polls of the GPUs")
    poll_static_refresh_interval: Duration = Field(
        300.0, gt=0, validation_alias=_renamed("poll_static_refresh_interval", "static_refresh_interval"),
        description="time between re-reads of names, limits, link maxima and unsupported queries",
    )  # fmt: skip
    poll_gpu_timeout: Duration = Field(
        10.0, gt=0, le=600, validation_alias=_renamed("poll_gpu_timeout", "gpu_timeout"),
        description="how long a poll waits for one GPU before reporting it down",
    )  # fmt: skip
    poll_slow_interval: Duration = Field(
        30.0, ge=0, le=3600,
        description="how often what changes slowly is re-read (ECC counts, remapped rows, NVLink link states, MIG "
        "instances' GPM, and the driver's PCIe sample where there are no byte counters); 0: every poll",
    )  # fmt: skip
    poll_release_for: Duration = Field(
        600.0, ge=0, le=86_400,
        description="after SIGUSR1 lets go of NVML (for a GPU reset or a driver upgrade), how long until it is taken "
        "again if no SIGUSR2 comes first; 0: until SIGUSR2",
    )  # fmt: skip
    profiling_interval: Duration = Field(
        10.0,
        ge=0.1,
        le=3600,
        description="how often GPM activity and per-process utilization are re-read; the driver spends about "
        "1.2 ms of CPU per GPU or MIG instance on GPM, 2 ms per GPU on process utilization",
    )
    simulate: bool = Field(False, description="simulate GPUs with realistic workloads instead of reading NVML")
    # One GPU of each simulated profile (sources.simulated.PROFILES), MIG and a lost GPU among them,
    # so that a first run fills every panel of the dashboards.
    simulate_gpus: int = Field(7, ge=1, le=1024, description="number of simulated GPUs, one of each workload from 7")
    log_format: Literal["auto", "logfmt", "json", "console"] = Field(  # gpu_exporter.logs.FORMATS
        "auto", description="logfmt or json, as Prometheus's exporters; console: readable lines; "
        "auto: json, console when stdout and stderr are terminals",
    )  # fmt: skip
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="the least severe level logged")
    node_name: str | None = Field(None, description="the node label on alerts; if none, $NODE_NAME, else the hostname")
    process_top_n: int = Field(20, ge=0, description="process series per GPU, the biggest first (0: all)")
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings, description="pods as holders, from the kubelet's pod-resources API"
    )
    slurm: SlurmSettings = Field(
        default_factory=SlurmSettings, description="Slurm jobs as holders: job_mapping_dir, job_from_cgroup"
    )
    containers: ContainerSettings = Field(
        default_factory=ContainerSettings, description="containers as holders, names from the Docker or Podman API"
    )
    rules: RulesSettings = Field(default_factory=RulesSettings, description="the alert rules and their thresholds")
    alerting: AlertingSettings = Field(
        default_factory=AlertingSettings, description="where alerts go: Alertmanagers and webhooks"
    )
    pricing: PricingSettings | None = Field(None, description="the price of an hour of each GPU model")
    accounting: AccountingSettings = Field(
        default_factory=AccountingSettings, description="how GPU time is kept by state and holder"
    )
    collectors: CollectorSettings = Field(
        default_factory=CollectorSettings, description="groups of series collected; one off makes none of its queries"
    )
    # gpu-exporter report's; the daemon does not read it
    report: ReportSettings = Field(
        default_factory=ReportSettings, description="gpu-exporter report's options (flags win); the daemon ignores them"
    )

    @field_validator("web_listen_address")
    @classmethod
    def _valid_address(cls, v: str) -> str:
        parse_listen_address(v)
        return v


def key_names(field_name: str, field: FieldInfo) -> list[str]:
    """The keys a setting is read under: its key by the naming rule first, then any old one."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    return [alias if isinstance(alias, str) else field.alias or field_name]


# Each top-level key -> the attribute it sets; and each old key, still read, -> the key of today.
SETTING_KEYS = {key_names(name, f)[0]: name for name, f in Settings.model_fields.items()}
OLD_KEYS = {old: key_names(name, f)[0] for name, f in Settings.model_fields.items() for old in key_names(name, f)[1:]}


def _variables() -> dict[str, str]:
    """The key each GPU_EXPORTER_* variable names -> the variable, as the environment spells it
    (pydantic-settings reads the names in any case)."""
    return {name.upper().removeprefix(ENV_PREFIX).lower(): name for name in os.environ if
            name.upper().startswith(ENV_PREFIX)}  # fmt: skip


def _one_spelling(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` with each old key under the key of today; a setting given under both is refused,
    as neither can be known to be the one meant."""
    out = dict(data)
    for old, key in OLD_KEYS.items():
        if old not in out:
            continue
        if key in out:
            raise ConfigError(f"{where} sets both {key!r} and {old!r}, one setting under its name and its old "
                              f"name: keep {key!r}")  # fmt: skip
        out[key] = out.pop(old)
    return out


def _one_variable(variables: dict[str, str]) -> None:
    """Refuses a setting whose variable is set under its name and its old name, as _one_spelling a key."""
    for old, key in OLD_KEYS.items():
        if old in variables and key in variables:
            raise ConfigError(f"both {variables[key]} and {variables[old]} are set, one setting under its name "
                              f"and its old name: keep {variables[key]}")  # fmt: skip


def _spelled(sources: list[dict[str, Any]]) -> dict[str, str]:
    """For each renamed setting given, the key as the source that wins (the first) spells it: the
    name a message about its value must use, the one the user will look for."""
    out: dict[str, str] = {}
    for old, key in OLD_KEYS.items():
        for given in sources:
            if key in given or old in given:
                out[key] = key if key in given else old
                break
    return out


class _OneSpelling(PydanticBaseSettingsSource):
    """Another source's settings, each old key under the key of today: of two sources that spell a
    setting differently, the higher must win, not the spelling pydantic tries first.  The
    environment's source of pydantic-settings 2.13 keeps the key a variable matched
    (GPU_EXPORTER_GPU_TIMEOUT: gpu_timeout); later ones rename it themselves."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return {OLD_KEYS.get(k, k): v for k, v in self._inner().items()}


def load_settings(
    cli: dict[str, Any] | None = None, config_file: Path | None = None, flags: Mapping[Loc, str] | None = None
) -> Settings:
    """Settings from every source.  ``cli`` holds only the flags actually given; ``flags`` names the
    flag that sets each path of it (``("poll_interval",)``: ``--poll.interval``), for messages."""
    file_data: dict[str, Any] | None = None
    if config_file is not None:
        try:
            file_data = read_mapping(config_file, "config file") or {}
        except YamlFileError as e:
            raise ConfigError(str(e)) from e
    variables = _variables()
    spelled = _spelled([cli or {}, dict.fromkeys(variables), file_data or {}])
    cli = _one_spelling(cli or {}, "the settings given")
    _one_variable(variables)
    if file_data is not None:
        file_data = _one_spelling(file_data, f"config file {config_file}")
    dcgm = _dcgm_environment()

    class _Sourced(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, _OneSpelling(settings_cls, env_settings)]
            if dcgm:
                sources.append(InitSettingsSource(settings_cls, init_kwargs=dcgm))
            if file_data is not None:
                sources.append(InitSettingsSource(settings_cls, init_kwargs=file_data))
            return tuple(sources)

    given = _Given(cli, variables, dcgm, file_data, config_file, flags or {})
    try:
        settings = _Sourced(**cli)
    except ValidationError as e:
        raise ConfigError(_describe(e, config_file, spelled, given.origin)) from e
    except SettingsError as e:  # a value in the environment that should be JSON and is not
        raise ConfigError(_describe_env(e)) from e
    _check_named_files(settings)
    return _rules_for_collectors(settings)


Loc = tuple[str | int, ...]


def _gives(data: Any, path: Loc) -> bool:
    """Whether ``data`` (a source's nested settings) holds a value at ``path``, or a whole value above
    it (a JSON variable, a list given at once)."""
    for part in path:
        if isinstance(data, dict):
            if part not in data:
                return False
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int):
            if part >= len(data):
                return False
            data = data[part]
        else:
            return True
    return True


@dataclass(frozen=True)
class _Given:
    """What each source gave, to say which one a bad value came from (the one that won)."""

    cli: dict[str, Any]
    variables: dict[str, str]
    dcgm: dict[str, Any]
    file_data: dict[str, Any] | None
    config_file: Path | None
    flags: Mapping[Loc, str]

    def origin(self, loc: Loc) -> str | None:
        """``flag --poll.interval``, ``GPU_EXPORTER_POLL_INTERVAL``, ``config file c.yaml``; None where
        no source gave it (a check across settings of several sources)."""
        if not loc:
            return None
        head = str(loc[0])
        heads = dict.fromkeys([head, OLD_KEYS.get(head, head), SETTING_KEYS.get(head, head),
                               *(old for old, key in OLD_KEYS.items() if key == head)])  # fmt: skip
        paths = [(h, *loc[1:]) for h in heads]
        for path in paths:
            if _gives(self.cli, path):
                flag = next((self.flags[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.flags), None)
                return f"flag {flag}" if flag else "a flag"
        for path in paths:
            env = "__".join(str(p) for p in path).lower()
            for key, name in self.variables.items():
                if env == key or env.startswith(key + "__"):
                    return name
        for path in paths:
            dcgm = DCGM_NAMES.get(tuple(str(p) for p in path))
            if dcgm and _gives(self.dcgm, path):
                return dcgm[1]
        if self.file_data is not None and any(_gives(self.file_data, path) for path in paths):
            return f"config file {self.config_file}"
        return None


def _dcgm_environment() -> dict[str, Any]:
    """Settings from dcgm-exporter's environment variables (``DCGM_NAMES``), nested as the file's."""
    out: dict[str, Any] = {}
    for path, (_, env) in DCGM_NAMES.items():
        value = os.environ.get(env, "")
        if not value:
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _rules_for_collectors(settings: Settings) -> Settings:
    off = settings.collectors.disabled()
    blind = [name for name, collector in RULES_NEEDING.items() if collector in off]
    if not blind:
        return settings
    rules = settings.rules.model_copy(
        update={name: getattr(settings.rules, name).model_copy(update={"enabled": False}) for name in blind}
    )
    return settings.model_copy(update={"rules": rules})


def _describe_env(e: SettingsError) -> str:
    m = re.search(r'field "([^"]+)"', str(e))
    field = m.group(1) if m else ""
    problems = []
    for name, value in sorted(os.environ.items()):
        rest = name.upper().removeprefix(ENV_PREFIX).lower()
        if not field or not name.upper().startswith(ENV_PREFIX):
            continue
        if rest != field and not rest.startswith(field + "__"):
            continue
        try:
            json.loads(value)
        except ValueError as err:
            shown = redacted(value, "password" if is_secret_key(rest) or "://" in value else None)
            problems.append(f"{name} must be JSON ({err}), got {short(shown)}")
    return clip("; ".join(problems)) if problems else clip(f"{e} (environment variables {ENV_PREFIX}*)")


def _check_named_files(settings: Settings) -> None:
    """Files named by settings must be readable now, not at the first alert."""
    for kind in ("alertmanagers", "webhooks"):
        for i, receiver in enumerate(getattr(settings.alerting, kind)):
            if not receiver.ca_file:
                continue
            try:
                ssl.create_default_context(cafile=receiver.ca_file)
            except (OSError, ssl.SSLError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                raise ConfigError(
                    f"invalid alerting.{kind}.{i}.ca_file = {receiver.ca_file!r}: "
                    f"cannot load it as CA certificates: {reason}"
                ) from e


def _known_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The keys allowed where ``loc`` points, for "unknown setting" messages."""
    model: Any = Settings
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    fields = getattr(model, "model_fields", {})
    return [key_names(name, f)[0] for name, f in fields.items()]


def _ratio_hint(err: Any) -> str:
    """``warning: 80`` for a ratio: a percentage meant, which the message should say as 0.8."""
    value, le = err.get("input"), (err.get("ctx") or {}).get("le")
    if isinstance(value, str):  # as an environment variable gives it
        try:
            value = float(value)
        except ValueError:
            return ""
    if err["type"] != "less_than_equal" or le != 1 or isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return f"; a ratio is meant (0 to 1): {value:g}% is {value / 100:g}" if 1 < value <= 100 else ""


def _describe(
    e: ValidationError,
    config_file: Path | None,
    spelled: dict[str, str] | None = None,
    origin: Callable[[Loc], str | None] | None = None,
) -> str:
    """One line per error, naming the setting as the user wrote it (``spelled``: an old key) and the
    source its value came from (``origin``), else every source it may have come from."""
    lines = []
    for err in e.errors():
        given = origin(tuple(err["loc"])) if origin is not None else None
        loc = tuple(err["loc"])
        if loc and spelled and loc[0] in spelled:
            loc = (spelled[loc[0]], *loc[1:])
        key = ".".join(str(p) for p in loc) or "settings"
        if err["type"] == "extra_forbidden":
            where = f" in {config_file}" if config_file else ""
            known = ", ".join(_known_keys(tuple(err["loc"])))
            lines.append(f"unknown setting {key!r}{where}; known here: {known}")
            continue
        # A secret is never quoted, nor a URL's password, path or query (see gpu_exporter.settings.redaction).
        value = err.get("input")
        secret = any(is_secret_key(str(part)) for part in loc)
        value = redacted(value, "password" if secret else None)
        msg = redact_text(err["msg"].removeprefix("Value error, ")) + _ratio_hint(err)
        env = ENV_PREFIX + "__".join(str(p) for p in loc).upper()
        dcgm = DCGM_NAMES.get(tuple(str(p) for p in loc))
        env = f"{env}, {dcgm[0]}, {dcgm[1]}" if dcgm else env
        now = f"the old name of {OLD_KEYS[str(loc[0])]}; " if loc and loc[0] in OLD_KEYS else ""
        where = f"from {given}" if given else f"flag, {env} or config key {key!r}"
        lines.append(f"invalid {key} ({now}{where}) = {short(value)}: {msg}")
    return clip("; ".join(lines))
