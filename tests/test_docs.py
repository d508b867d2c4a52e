"""docs/ and the README: links that lead somewhere, a /metrics sample that cannot drift from the
code, a mapping table and troubleshooting messages that name what the exporter really has and says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.metric_defs import METRICS
from tests.exporter_helpers import http_get, run_daemon, wait_for
from tests.fakenvml.presets import preset

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {slug(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_local_link_and_anchor_leads_somewhere(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


def test_the_readme_stays_short_and_links_each_reference_page() -> None:
    readme = (ROOT / "README.md").read_text()
    # A front door (issue 51): what it is, the two commands, what it finds, a sample, and links.
    assert len(readme.splitlines()) < 200
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in readme, f"{page.name} is not linked from the README"
    titles = re.findall(r"(?m)^## (.+)$", readme)
    assert titles[:5] == ["What it finds", "Running it", "Alerts", "Deploying", "Documentation"], titles


def metrics_sample() -> str:
    text = (DOCS / "metrics.md").read_text().split("## A sample of /metrics", 1)[1]
    return text.split("```text\n", 1)[1].split("```", 1)[0]


def test_the_metrics_sample_parses_and_every_name_in_it_is_still_exported(scenario_path: Path) -> None:
    sample = {f.name: f for f in text_string_to_metric_families(metrics_sample())}
    assert len(sample) > 40
    preset("pcie-degraded", scenario_path).write()  # the scenario the sample was taken from
    with run_daemon(scenario_path, "--poll.interval", "1s") as d:

        def families() -> dict[str, list[str]]:
            body = http_get(d.url + "/metrics")[2].decode()
            return {f.name: sorted({k for s in f.samples for k in s.labels}) for f in
                    text_string_to_metric_families(body)}  # fmt: skip

        wait_for(lambda: "gpu_pcie_tx_bytes_per_second" in families(), timeout=30, what="a second poll")
        today = families()
    missing = sorted(set(sample) - set(today))
    assert missing == [], f"in the docs' sample but no longer exported: {missing}"
    relabelled = {n: (sorted({k for s in f.samples for k in s.labels}), today[n]) for n, f in sample.items()
                  if sorted({k for s in f.samples for k in s.labels}) != today[n]}  # fmt: skip
    assert relabelled == {}, "labels changed since the sample was taken: regenerate it"


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    return tmp_path / "sample.scn"


def test_the_mapping_table_names_our_metrics_and_labels() -> None:
    section = (DOCS / "metrics.md").read_text().split("## Coming from dcgm-exporter", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header
    rows = [[cell.strip() for cell in line.split("|")[1:4]] for line in table]
    assert len(rows) >= 30
    sample = {f.name: f for f in text_string_to_metric_families(metrics_sample())}
    for dcgm, smi, ours in rows:
        assert dcgm.startswith("`DCGM_FI_") or smi.startswith("`nvidia_smi_"), (dcgm, smi)
        for name, labels in re.findall(r"`([a-z_0-9]+)(?:\{([^}]*)\})?`", ours):
            assert name in METRICS, name
            for key, value in re.findall(r'(\w+)="([^"]*)"', labels):
                family = sample[name.removesuffix("_total") if METRICS[name].type == "counter" else name]
                assert any(s.labels.get(key) == value for s in family.samples), (name, key, value)


def test_troubleshooting_quotes_messages_the_exporter_really_prints() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    quoted = [q for line in re.findall(r"(?m)^Messages?: (.*(?:\n(?!\n).*)*)", text)
              for q in re.findall(r"`([^`]+)`", line)]  # fmt: skip
    assert len(quoted) >= 6
    code = "\n".join(p.read_text() for p in (ROOT / "gpu_exporter").rglob("*.py"))
    code_text = code.replace('"\n', "").replace('" ', "")
    for message in quoted:
        # A message may be built from an f-string: compare its fixed parts.
        parts = [p for p in re.split(r"/var/lib/kubelet/pod-resources/kubelet.sock", message) if p.strip()]
        for part in parts:
            assert part.strip() in code or part.strip() in code_text, f"not in the code: {part!r}"
    for topic in ("No NVML", "Permissions", "Containers", "MIG", "kubelet"):
        assert re.search(rf"(?m)^## .*{topic}", text), topic
