"""Writes the generated parts of the Helm chart in deploy/helm/gpu-exporter from their one source:

- files/rules/: alerts/gpu-exporter.rules.yml, gpu-cost.rules.yml and gpu-report.rules.yml (the
  PrometheusRule, the same files alerts/render_prometheusrule.py renders for kustomize) and
  alerts/dcgm-compat.rules.yml;
- files/dashboards/: deploy/grafana/dashboards/*.json (the Grafana sidecar's ConfigMaps);
- Chart.yaml's version and appVersion: pyproject.toml's version;
- values.schema.json's definitions of `config`: the exporter's own settings (gpu_exporter/settings/config.py),
  so that a setting the daemon would refuse (an unknown key, a negative duration, a bad choice) fails
  `helm install` first, naming it. Durations take the daemon's spellings (5s, 500ms, 1h or seconds),
  within the setting's own bounds in every unit (settings.durations.bounded_pattern);
  the settings the chart sets itself are left out, and so are inline secrets (bearer_token,
  basic_auth_password): secrets come from files of mounted Secrets.

    .venv/bin/python deploy/helm/generate.py                  # rewrite what is stale
    .venv/bin/python deploy/helm/generate.py --check          # exit 1 naming what is stale (tests/test_helm.py)
    .venv/bin/python deploy/helm/generate.py --package DIR    # rewrite, then `helm package` into DIR
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

from alerts.render_prometheusrule import RULE_FILES  # noqa: E402
from gpu_exporter.settings.config import OLD_KEYS, Settings, key_names  # noqa: E402
from gpu_exporter.settings.durations import bounded_pattern, parse_duration  # noqa: E402

CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
COMPAT_RULES = ROOT / "alerts" / "dcgm-compat.rules.yml"
SCHEMA = CHART / "values.schema.json"
# The daemon's duration strings (gpu_exporter/settings/durations.py); a leading "-" does not match.
DURATION = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d|w)?\s*$"
# Settings the chart sets itself (web_listen_address from `port`, web_config_file from `webConfig`,
# node_name from the node each pod runs on), or that the daemon does not read.
CHART_OWNED = ("web_listen_address", "web_config_file", "node_name", "simulate", "simulate_gpus", "report")
# Secrets written into the config file would land in a ConfigMap: only their *_file forms are allowed.
INLINE_SECRETS = ("bearer_token", "basic_auth_password")
NOISE = ("title", "ge", "le", "writeOnly")


def copies() -> dict[Path, bytes]:
    """Chart file -> the content it must have."""
    out = {CHART / "files" / "rules" / f.name: f.read_bytes() for f in (*RULE_FILES, COMPAT_RULES)}
    out |= {CHART / "files" / "dashboards" / f.name: f.read_bytes() for f in sorted(DASHBOARDS.glob("*.json"))}
    return out


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    if not re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", version):
        raise SystemExit(f"pyproject.toml's version {version!r} is not SemVer, which a chart version must be")
    return version


def chart_yaml(text: str, version: str) -> str:
    for key in ("version", "appVersion"):
        text, n = re.subn(rf"(?m)^{key}: .*$", f"{key}: {version}", text)
        if n != 1:
            raise SystemExit(f"{CHART / 'Chart.yaml'}: expected one `{key}:` line")
    return text


def models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every settings model under ``root``, by the name pydantic gives its schema definition."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ not in found:
                found[tp.__name__] = tp
                for field in tp.model_fields.values():
                    visit(field.annotation)
            return
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is not None:
            for arg in typing.get_args(tp):
                visit(arg)

    visit(root)
    return found


def is_duration(field: Any) -> bool:
    return any(getattr(m, "func", None) is parse_duration for m in field.metadata)


def duration_pattern(number: dict[str, Any]) -> str:
    """The strings a duration setting takes, within the same bounds as its numbers (``2h`` where the
    daemon takes at most 3600 fails ``helm install``, as 7200 does)."""
    if not number:
        return DURATION
    exclusive = "exclusiveMinimum" in number
    low = number.get("exclusiveMinimum", number.get("minimum", 0))
    return bounded_pattern(low, number.get("maximum"), low_exclusive=exclusive)


def clean(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: clean(v) for k, v in node.items() if k not in NOISE}
        if out.get("format") in ("path", "password"):
            del out["format"]
        return out
    if isinstance(node, list):
        return [clean(v) for v in node]
    return node


def config_definitions() -> dict[str, Any]:
    """values.schema.json's definitions for `config`: "config" (the file) and "config.<Model>"."""
    schema = Settings.model_json_schema(by_alias=True, ref_template="#/definitions/config.{model}")
    defs: dict[str, Any] = {f"config.{k}": v for k, v in schema.pop("$defs").items()}
    defs["config"] = schema
    for name, model in models(Settings).items():
        definition = defs["config" if model is Settings else f"config.{name}"]
        props = definition["properties"]
        for field_name, field in model.model_fields.items():
            key = key_names(field_name, field)[0]
            if key in props and is_duration(field):
                number = {k: v for k, v in props[key].items() if k in ("exclusiveMinimum", "minimum", "maximum")}
                described = {k: v for k, v in props[key].items() if k in ("description", "default")}
                props[key] = {
                    **described,
                    "anyOf": [{"type": "number", **number}, {"type": "string", "pattern": duration_pattern(number)}],
                }
        for key in INLINE_SECRETS:
            props.pop(key, None)
        if "url_file" in props:  # a webhook or Alertmanager URL may come from a file instead
            definition["required"] = [r for r in definition.get("required", []) if r != "url"]
            definition["anyOf"] = [{"required": ["url"]}, {"required": ["url_file"]}]
    root = defs["config"]
    for key in CHART_OWNED:
        root["properties"].pop(key)
    # A renamed setting's old key is still read, so a values file written for it must still pass.
    for old, key in OLD_KEYS.items():
        if key in root["properties"]:
            root["properties"][old] = {**root["properties"][key], "description": f"the old name of {key}, still read"}
    root["description"] = "the exporter's config file (docs/running.md, Configuration), less what the chart sets"
    root["additionalProperties"] = False
    # Definitions only the left-out settings used (report's) go too.
    used: set[str] = set()
    pending = ["config"]
    while pending:
        name = pending.pop()
        if name not in used:
            used.add(name)
            pending += re.findall(r'"#/definitions/(config\.\w+)"', json.dumps(defs[name]))
    out: dict[str, Any] = clean({k: v for k, v in sorted(defs.items()) if k in used})
    return out


def schema_json(text: str) -> str:
    schema = json.loads(text)
    kept = {k: v for k, v in schema["definitions"].items() if k != "config" and not k.startswith("config.")}
    schema["definitions"] = kept | config_definitions()
    return json.dumps(schema, indent=2) + "\n"


def wanted() -> dict[Path, bytes]:
    out = copies()
    version = project_version()
    out[CHART / "Chart.yaml"] = chart_yaml((CHART / "Chart.yaml").read_text(), version).encode()
    out[SCHEMA] = schema_json(SCHEMA.read_text()).encode()
    return out


def stale() -> list[Path]:
    want = wanted()
    extra = [p for d in ("rules", "dashboards") for p in (CHART / "files" / d).glob("*") if p not in want]
    return sorted([p for p, data in want.items() if not p.exists() or p.read_bytes() != data] + extra)


def write() -> None:
    want = wanted()
    for d in ("rules", "dashboards"):
        for p in (CHART / "files" / d).glob("*"):
            if p not in want:
                p.unlink()
                print(f"removed {p.relative_to(ROOT)}")
    for path, data in want.items():
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            print(f"wrote {path.relative_to(ROOT)}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        out = stale()
        for p in out:
            print(f"{p.relative_to(ROOT)} is stale: run .venv/bin/python deploy/helm/generate.py", file=sys.stderr)
        return 1 if out else 0
    if argv[:1] == ["--package"] and len(argv) == 2:
        write()
        helm = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
        if helm is None:
            raise SystemExit("helm is not installed: bash .ci/setup puts it into .venv/bin")
        return subprocess.run([helm, "package", str(CHART), "--destination", argv[1]], check=False).returncode
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
