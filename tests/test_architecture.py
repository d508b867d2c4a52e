"""The package's dependency rules, checked on the import graph so they stay true as the code grows.

Data flows one way: NVML -> snapshot -> (metrics, rules, ``--once``, accounting).  Each part's
``__init__.py`` states what it may import; this walks every ``import`` statement (also those inside
functions, where lazy imports live) and holds the code to it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "gpu_exporter"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# The parts: subpackages, and the shared model.  The wiring at the top (cli, daemon, polling, config,
# once, logs) may import any part.
PARTS = ("snapshot", "metric_defs", "sources", "alerting", "serving", "kubernetes", "holders", "accounting",
         "report", "web")  # fmt: skip
WIRING = ("cli", "daemon", "polling", "settings.config", "once", "logs", "__main__")
# Parsing helpers with no dependencies, usable anywhere.
HELPERS = ("settings.durations", "settings.yamlfile", "untrusted", "settings.redaction")
# A package whose modules are parts of their own: settings holds both the model (wiring) and helpers.
SPLIT_PACKAGES = ("settings",)


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted module name (for "from x import y": x.y if that is a module, else x)
    line: int


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[Import]:
    """Every import in the file, resolved to absolute dotted names."""
    name = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                # A module's own package is its parent; a package's __init__ is its own package.
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                candidate = f"{prefix}.{alias.name}"
                yield Import(name, candidate if is_module(candidate, root) else prefix, node.lineno)


def is_module(dotted: str, root: Path) -> bool:
    parts = dotted.split(".")
    if parts[0] != root.name:
        return False
    path = root.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph(root: Path) -> list[Import]:
    return [imp for path in sorted(root.rglob("*.py")) for imp in imports_of(path, root)]


def part_of(module: str, package: str = PACKAGE) -> str | None:
    """The part a module belongs to: a subpackage or top-level module name; None outside the package."""
    parts = module.split(".")
    if parts[0] != package:
        return None
    if len(parts) > 2 and parts[1] in SPLIT_PACKAGES:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else "__init__"


# What the two parts that join holders onto the snapshot (pods; jobs and containers) must never import.
_ASIDE = {"sources", "serving", "alerting", "accounting", "report", "metric_defs", "web", "kubernetes", "holders",
          *WIRING, *HELPERS}  # fmt: skip
# part -> the parts of the package it must never import.
FORBIDDEN: dict[str, set[str]] = {
    "snapshot": {*PARTS, *WIRING, *HELPERS} - {"snapshot"},
    # The declaration of every metric reads snapshots, and nothing else.
    "metric_defs": {*PARTS, *WIRING, *HELPERS} - {"snapshot", "metric_defs"},
    "settings.durations": {*PARTS, *WIRING},
    "settings.yamlfile": {*PARTS, *WIRING, "settings.durations"},
    "untrusted": {*PARTS, *WIRING, "settings.durations", "settings.yamlfile"},
    "settings.redaction": {*PARTS, *WIRING, "settings.durations", "settings.yamlfile", "untrusted"},
    "sources": {"serving", "alerting", "kubernetes", "holders", "accounting", "report", "web", *WIRING},
    "alerting": {"serving", "sources", "kubernetes", "holders", "accounting", "report", "web", *WIRING},
    # What is shown knows nothing of how it is served: the wiring hands the pages to the server.
    "serving": {"sources", "kubernetes", "holders", "report", "web", *WIRING},
    # The kubelet's answers are decoded here; of the helpers, only the one for text from outside.
    "kubernetes": _ASIDE - {"untrusted"},
    # Jobs and containers (cgroups, mapping files, engine sockets): like the kubelet's pods, beside the flow.
    # The job mapping files are opened as every file a person names is (settings.yamlfile.open_regular).
    "holders": _ASIDE - {"untrusted", "settings.yamlfile"},
    # The books read snapshots; the idle threshold comes from the wiring, not from alerting.
    "accounting": {"sources", "serving", "alerting", "kubernetes", "holders", "report", "web", *WIRING},
    # The report reads a Prometheus API: it never sees a snapshot, let alone a GPU.
    "report": {"snapshot", "metric_defs", "sources", "serving", "alerting", "kubernetes", "holders", "web", *WIRING},
    # The web server knows HTTP, TLS and basic auth, and is given its pages: nothing of what it serves.
    "web": {*PARTS, *WIRING} - {"web"},
}
# Libraries a part must never use, though another may.
FORBIDDEN_LIBRARIES: dict[str, set[str]] = {
    "accounting": {"http", "urllib", "socket", "prometheus_client"},  # no HTTP, no exposition
    "report": {"prometheus_client"},  # it queries Prometheus; it exports nothing
}
# Third-party libraries that only one part may know.
OWNED_LIBRARIES = {
    "pynvml": f"{PACKAGE}.sources.nvml",  # one package is the only place that knows NVML
    "h2": f"{PACKAGE}.kubernetes.grpc_unix",  # HTTP/2 for the kubelet's gRPC, in one module
    "asyncio.sslproto": f"{PACKAGE}.web.tls",  # asyncio's private TLS protocol, behind one adapter
    "bcrypt": f"{PACKAGE}.web.auth",  # password checks, bounded in one place
}
# Libraries only the tests use: the fake kubelet serves gRPC with grpcio and protobuf, while the
# exporter speaks it without them (about 17 MiB less resident memory).
TEST_ONLY_LIBRARIES = ("grpc", "google.protobuf")
# Who may import the entry points: nothing imports cli or daemon, except the chain that starts them.
ENTRY_POINTS = {f"{PACKAGE}.cli": {f"{PACKAGE}.__main__"}, f"{PACKAGE}.daemon": {f"{PACKAGE}.cli"}}


def violations(root: Path) -> list[str]:
    package = root.name
    found: list[str] = []
    for imp in graph(root):
        where = f"{imp.importer} line {imp.line}: imports {imp.imported}"
        src, dst = part_of(imp.importer, package), part_of(imp.imported, package)
        if src is not None and dst is not None and src != dst and dst in FORBIDDEN.get(src, set()):
            found.append(f"{where} ({src} must not import {dst})")
        for library in FORBIDDEN_LIBRARIES.get(src or "", set()) if src != "__init__" else set():
            if imp.imported == library or imp.imported.startswith(library + "."):
                found.append(f"{where} ({src} must not use {library})")
        for library, owner in OWNED_LIBRARIES.items():
            owner = owner.replace(PACKAGE, package, 1)
            mine = imp.importer == owner or imp.importer.startswith(owner + ".")
            if (imp.imported == library or imp.imported.startswith(library + ".")) and not mine:
                found.append(f"{where} (only {owner} may use {library})")
        for library in TEST_ONLY_LIBRARIES:
            if imp.imported == library or imp.imported.startswith(library + "."):
                found.append(f"{where} ({library} is for tests only)")
        for entry, allowed in ENTRY_POINTS.items():
            entry = entry.replace(PACKAGE, package, 1)
            allowed = {a.replace(PACKAGE, package, 1) for a in allowed}
            hits_entry = imp.imported == entry or imp.imported.startswith(entry + ".")
            if hits_entry and imp.importer not in allowed and imp.importer != entry:
                found.append(f"{where} (nothing imports {entry} but {', '.join(sorted(allowed))})")
    return found


def part_cycles(root: Path) -> list[list[str]]:
    """Cycles between parts (subpackages and top-level modules), which would blur the one-way flow."""
    package = root.name
    edges: dict[str, set[str]] = {}
    for imp in graph(root):
        src, dst = part_of(imp.importer, package), part_of(imp.imported, package)
        if src and dst and src != dst and dst != "__init__":
            edges.setdefault(src, set()).add(dst)
    return cycles_of(edges)


def cycles_of(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of a graph, found by a depth-first walk from every node in name order."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def module_cycles(root: Path, within: str) -> list[list[str]]:
    """Cycles between the modules of one package (``within``, dotted), imports for type checking
    included: a cycle there is two modules that cannot be read, tested or changed one without the other."""
    prefix = f"{root.name}.{within}."
    edges: dict[str, set[str]] = {}
    for imp in graph(root):
        if imp.importer.startswith(prefix) and imp.imported.startswith(prefix) and imp.importer != imp.imported:
            edges.setdefault(imp.importer, set()).add(imp.imported)
    return [[m.removeprefix(prefix) for m in cycle] for cycle in cycles_of(edges)]


# Packages whose modules import one way (issue 51, item 5); the others join the list as their cycles go.
ACYCLIC_PACKAGES = ("web", "report", "alerting", "accounting", "holders", "kubernetes", "serving")


@pytest.mark.parametrize("package", ACYCLIC_PACKAGES)
def test_the_modules_of_a_package_import_one_way(package: str) -> None:
    assert module_cycles(ROOT, package) == []


def test_a_cycle_between_modules_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "gpu_exporter"
    (root / "web").mkdir(parents=True)
    for name in ("__init__", "web/__init__"):
        (root / f"{name}.py").write_text("")
    (root / "web" / "connection.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .table import T\n"
    )
    (root / "web" / "table.py").write_text("from .connection import C\n")
    assert module_cycles(root, "web") == [["connection", "table", "connection"]]


def test_the_package_keeps_its_dependency_rules() -> None:
    assert violations(ROOT) == []


def test_the_parts_import_each_other_one_way_only() -> None:
    assert part_cycles(ROOT) == []


def test_every_part_says_what_it_does_and_may_import() -> None:
    for part in PARTS:
        init = ROOT / part / "__init__.py"
        if not init.exists():
            assert (ROOT / f"{part}.py").is_file(), f"{part} is neither a module nor a subpackage"
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc and "Never" in doc, f"{init} must say what the part may import"


def test_the_top_level_holds_eight_modules_or_fewer_each_with_a_place() -> None:
    """A reader sees the parts as folders: the top level is the wiring, the model and one helper."""
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 8, top
    known = {*PARTS, *WIRING, *HELPERS}
    folders = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    for split in SPLIT_PACKAGES:
        folders.remove(split)
        folders += [f"{split}.{m.stem}" for m in (ROOT / split).glob("*.py") if m.stem != "__init__"]
    assert [name for name in top + folders if name not in known] == []


def test_the_graph_sees_the_imports_that_matter() -> None:
    """The walk must resolve relative and lazy imports, or the rules above would pass vacuously."""
    edges = {(i.importer, i.imported) for i in graph(ROOT)}
    assert (f"{PACKAGE}.sources.poller", f"{PACKAGE}.snapshot") in edges  # "from ..snapshot import"
    assert (f"{PACKAGE}.cli", f"{PACKAGE}.daemon") in edges  # a lazy import inside a function
    assert (f"{PACKAGE}.sources.nvml.device", "pynvml") in edges


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for sub in {p.parent for p in root.rglob("*.py")}:
        (sub / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"snapshot.py": "from .sources import poller\n", "sources/poller.py": ""}, "snapshot must not import sources"),
        (
            {"sources/poller.py": "def f():\n    from ..serving import metrics\n", "serving/metrics.py": ""},
            "sources must not import serving",
        ),
        (
            {"alerting/engine.py": "from ..serving.metrics import X\n", "serving/metrics.py": ""},
            "alerting must not import serving",
        ),
        ({"serving/metrics.py": "import pynvml\n"}, "only gpu_exporter.sources.nvml may use pynvml"),
        (
            {"metric_defs.py": "from .serving import metrics\n", "serving/metrics.py": ""},
            "metric_defs must not import serving",
        ),
        ({"sources/poller.py": "import pynvml\n"}, "only gpu_exporter.sources.nvml may use pynvml"),
        (
            {"settings/durations.py": "from .config import Settings\n", "settings/config.py": ""},
            "settings.durations must not import settings.config",
        ),
        (
            {"web/config.py": "from ..settings.config import Settings\n", "settings/config.py": ""},
            "web must not import settings.config",
        ),
        ({"once.py": "from .daemon import Daemon\n", "daemon.py": ""}, "nothing imports gpu_exporter.daemon"),
        ({"serving/page.py": "from gpu_exporter import cli\n", "cli.py": ""}, "nothing imports gpu_exporter.cli"),
        (
            {"accounting/ledger.py": "from ..sources import nvml\n", "sources/nvml.py": ""},
            "accounting must not import sources",
        ),
        ({"accounting/ledger.py": "import http.server\n"}, "accounting must not use http"),
        (
            {"serving/pages.py": "from ..web.server import HttpServer\n", "web/server.py": ""},
            "serving must not import web",
        ),
        ({"web/server.py": "from ..serving import pages\n", "serving/pages.py": ""}, "web must not import serving"),
        (
            {"web/server.py": "from ..alerting.engine import Alert\n", "alerting/engine.py": ""},
            "web must not import alerting",
        ),
        ({"web/table.py": "import asyncio.sslproto\n"}, "only gpu_exporter.web.tls may use asyncio.sslproto"),
        (
            {"accounting/ledger.py": "from prometheus_client import Counter\n"},
            "accounting must not use prometheus_client",
        ),
        (
            {"report/query.py": "from ..sources import poller\n", "sources/poller.py": ""},
            "report must not import sources",
        ),
        (
            {"report/query.py": "from ..snapshot import NodeSnapshot\n", "snapshot.py": ""},
            "report must not import snapshot",
        ),
        (
            {"sources/nvml.py": "from ..accounting import ledger\n", "accounting/ledger.py": ""},
            "sources must not import accounting",
        ),
        (
            {"holders/attribution.py": "from ..sources import procfs\n", "sources/procfs.py": ""},
            "holders must not import sources",
        ),
        (
            {"serving/metrics.py": "from ..holders import engines\n", "holders/engines.py": ""},
            "serving must not import holders",
        ),
    ],
)
def test_a_broken_rule_is_reported_with_where_and_why(tmp_path: Path, files: dict[str, str], needle: str) -> None:
    found = violations(_tree(tmp_path, files))
    assert any(needle in v for v in found), found


def test_a_cycle_between_parts_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, {"alerting/engine.py": "from ..once import x\n", "once.py": "from .alerting import engine\n"}
    )
    assert part_cycles(root) == [["alerting", "once", "alerting"]]


def test_the_architecture_diagram_names_every_part() -> None:
    text = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("# How it works", 1)[1].split("\n## ", 1)[0]
    subpackages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert subpackages, "no subpackages found"
    missing = [name for name in subpackages if f"{name}/" not in section]
    assert missing == [], f"docs/architecture.md 'How it works' does not show {missing}"
