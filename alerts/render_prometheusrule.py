"""Renders deploy/k8s/base/prometheusrule.yaml (a prometheus-operator PrometheusRule) from the plain
rule files, the alerts, the cost recording rules and the report's hourly ones, each group as it is
there, so the two forms cannot drift: tests/test_alert_rules.py fails if the output differs.

    .venv/bin/python alerts/render_prometheusrule.py          # rewrite the file
    .venv/bin/python alerts/render_prometheusrule.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Every group of these files, in this order: the alerts, what the GPUs cost and waste, and the hourly
# series `gpu-exporter report` reads over long ranges.
RULE_FILES = tuple(
    ROOT / "alerts" / name for name in ("gpu-exporter.rules.yml", "gpu-cost.rules.yml", "gpu-report.rules.yml")
)
OUTPUT = ROOT / "deploy" / "k8s" / "base" / "prometheusrule.yaml"
HEADER = (
    f"# Generated from {', '.join(f'alerts/{f.name}' for f in RULE_FILES)} by alerts/render_prometheusrule.py; "
    "do not edit.\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    # Multi-line expressions stay readable blocks, as in the source file.
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def groups() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in RULE_FILES:
        out += yaml.safe_load(path.read_text())["groups"]
    names = [g["name"] for g in out]
    if len(set(names)) != len(names):  # Prometheus refuses a rule file with a group name twice
        raise SystemExit(f"group names repeat across {', '.join(str(f) for f in RULE_FILES)}: {names}")
    return out


def render() -> str:
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-exporter",
            "labels": {"app.kubernetes.io/name": "gpu-exporter", "app.kubernetes.io/component": "alert-rules"},
        },
        "spec": {"groups": groups()},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run alerts/render_prometheusrule.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
