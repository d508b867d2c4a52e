"""The Dockerfile's install steps work, proven without a Docker engine.

The Dockerfile is parsed, not restated: its build context is assembled through .dockerignore,
its COPY lines fill each stage, and its RUN lines run through ``/bin/sh -c`` with the ARG and ENV
values they would see. Every absolute path in those values (and WORKDIR) is moved under a
per-stage temporary root, and a ``RUN --mount=type=bind,from=...`` becomes a symlink into the
other stage's root for the length of that RUN. "The base image's python" is a fresh virtualenv
with only pip. The only RUN not executed is the one creating the system user (it would change
this machine); its UID is checked against USER instead.

The resulting virtualenv then has to run ``gpu-exporter --version`` and ``--once --simulate``
through the ENTRYPOINT and PATH the image declares, answer the HEALTHCHECK, hold exactly the
runtime dependency closure of the project and nothing of the test extras.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import Distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
USER_CREATION = re.compile(r"^\s*(groupadd|useradd)\b")


# --- Dockerfile parsing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str  # as written, variables unexpanded
    name: str
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Dockerfile:
    global_args: list[Instruction]
    stages: list[Stage]


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions with their continuation lines joined; comment lines (also those inside a
    continuation, as Docker allows) and parser directives dropped."""
    logical: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if not buf:
            start = number
        if raw.rstrip().endswith("\\"):
            buf.append(raw.rstrip()[:-1])
            continue
        buf.append(raw)
        joined = " ".join(part.strip() for part in buf if part.strip())
        keyword, _, args = joined.partition(" ")
        logical.append(Instruction(keyword.upper(), args.strip(), start))
        buf = []
    assert not buf, "the Dockerfile ends inside a continuation line"

    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for ins in logical:
        if ins.keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", ins.args, flags=re.IGNORECASE)
            assert m, f"line {ins.line}: FROM {ins.args}"
            stages.append(Stage(base=m.group(1), name=m.group(2) or str(len(stages))))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may come before FROM"
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(global_args, stages)


def expand(value: str, env: dict[str, str]) -> str:
    """Docker's variable substitution: $VAR, ${VAR}, ${VAR:-default}, ${VAR:+alternative}."""

    def sub(m: re.Match[str]) -> str:
        name = m.group("name") or m.group("bare")
        op, word = m.group("op"), m.group("word") or ""
        current = env.get(name, "")
        if op == ":-":
            return current or expand(word, env)
        if op == ":+":
            return expand(word, env) if current else ""
        return current

    pattern = (
        r"\$(?:\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:[-+])(?P<word>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
    )
    return re.sub(pattern, sub, value)


def parse_assignments(args: str) -> list[tuple[str, str | None]]:
    """``KEY=value KEY2="a b"`` (ENV, LABEL) or ``NAME[=default]`` (ARG), quotes removed."""
    pairs: list[tuple[str, str | None]] = []
    for word in shlex.split(args):
        key, eq, value = word.partition("=")
        pairs.append((key, value if eq else None))
    return pairs


def split_flags(args: str) -> tuple[dict[str, str], str]:
    """Leading ``--flag=value`` options of RUN/COPY/HEALTHCHECK, and the rest."""
    flags: dict[str, str] = {}
    rest = args
    while m := re.match(r"--([a-z-]+)=(\S+)\s+", rest):
        flags[m.group(1)] = m.group(2)
        rest = rest[m.end() :]
    return flags, rest


# --- .dockerignore ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    negated: bool
    pattern: str
    regex: re.Pattern[str]


def dockerignore_rules() -> list[IgnoreRule]:
    """The patterns of .dockerignore, with Go filepath.Match semantics plus ``**``."""
    rules: list[IgnoreRule] = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append(IgnoreRule(negated, pattern, re.compile(regex)))
    return rules


def ignored(relpath: str, rules: list[IgnoreRule]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = relpath.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for rule in rules:
        if any(rule.regex.fullmatch(c) for c in candidates):
            result = not rule.negated
    return result


def may_reinclude_below(directory: str, rules: list[IgnoreRule]) -> bool:
    """Whether an exception (``!pattern``) could match something inside ``directory``."""
    for rule in rules:
        if rule.negated:
            literal = re.split(r"[*?\[]", rule.pattern, maxsplit=1)[0]
            wildcard = literal != rule.pattern
            if literal.startswith(directory + "/") or (wildcard and (directory + "/").startswith(literal)):
                return True
    return False


def build_context(dest: Path) -> list[str]:
    """Copies the files Docker would send as the build context; returns their paths."""
    rules = dockerignore_rules()
    sent: list[str] = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # Docker looks inside an excluded directory only when an exception could apply there.
        dirnames[:] = [
            d for d in dirnames if not ignored(rel_dir + d, rules) or may_reinclude_below(rel_dir + d, rules)
        ]
        for name in filenames:
            rel = rel_dir + name
            if not ignored(rel, rules):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)
                sent.append(rel)
    return sent


# --- running the stages -------------------------------------------------------------------------


@dataclass
class StageResult:
    root: Path
    env: dict[str, str]
    user: str | None = None
    expose: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    executed: list[str] = field(default_factory=list)
    not_executed: list[str] = field(default_factory=list)
    base: str = ""


def base_environment(base_python_bin: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    env["PATH"] = f"{base_python_bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def in_image(path: str, root: Path) -> str:
    """The path inside the image of a path moved under ``root``."""
    return "/" + os.path.relpath(path, root) if Path(path).is_relative_to(root) else path


def run_stage(
    stage: Stage,
    global_args: dict[str, str],
    root: Path,
    base_env: dict[str, str],
    context: Path,
    done: dict[str, StageResult],
) -> StageResult:
    env = dict(base_env)
    args_only: set[str] = set()  # ARGs: seen by RUN, not kept in the image's environment
    result = StageResult(root=root, env=env, base=expand(stage.base, global_args))
    workdir = root

    def value_of(raw: str, seen: dict[str, str]) -> str:
        value = expand(raw, seen)
        # A literal absolute path is a path inside the image: move it under root.
        return str(root) + value if raw.startswith("/") else value

    for ins in stage.instructions:
        kw = ins.keyword
        if kw == "ARG":
            for name, default in parse_assignments(ins.args):
                raw = default if default is not None else global_args.get(name)
                if raw is not None:
                    env[name] = value_of(raw, env)
                    args_only.add(name)
        elif kw == "ENV":
            before = dict(env)  # every pair of one ENV line sees the values from before it
            for name, raw_value in parse_assignments(ins.args):
                assert raw_value is not None, f"line {ins.line}: ENV {name} without a value"
                env[name] = value_of(raw_value, before)
                args_only.discard(name)
        elif kw == "WORKDIR":
            path = expand(ins.args, env)
            workdir = Path(str(root) + path) if path.startswith("/") else workdir / path
            workdir.mkdir(parents=True, exist_ok=True)
        elif kw == "COPY":
            flags, rest = split_flags(ins.args)
            assert "from" not in flags, f"line {ins.line}: COPY --from is not modelled by this test"
            *sources, dest = shlex.split(rest)
            target = Path(str(root) + dest) if dest.startswith("/") else workdir / dest
            for src in sources:
                matches = sorted(context.glob(expand(src, env).rstrip("/")))
                assert matches, f"line {ins.line}: COPY {src}: not in the build context (.dockerignore?)"
                for m in matches:
                    if m.is_dir():
                        shutil.copytree(m, target, dirs_exist_ok=True)
                    elif dest.endswith("/") or len(sources) > 1:
                        target.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(m, target / m.name)
                    else:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(m, target)
        elif kw == "RUN":
            flags, command = split_flags(ins.args)
            assert not command.startswith("["), f"line {ins.line}: exec-form RUN is not modelled"
            if all(USER_CREATION.match(part) for part in command.split("&&")):
                result.not_executed.append(command)
                continue
            links: list[Path] = []
            if "mount" in flags:
                mount = dict(item.split("=", 1) for item in flags["mount"].split(","))
                assert mount.get("type") == "bind" and "from" in mount, f"line {ins.line}: unsupported mount"
                source = done[mount["from"]].root / in_image(expand(mount["source"], env), root).lstrip("/")
                target = root / in_image(expand(mount["target"], env), root).lstrip("/")
                assert source.is_dir(), f"line {ins.line}: {mount['source']} does not exist in stage {mount['from']}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source, target_is_directory=True)
                links.append(target)
            try:
                proc = subprocess.run(
                    ["/bin/sh", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
                )
            finally:
                for link in links:
                    link.unlink()
            assert proc.returncode == 0, f"line {ins.line}: RUN {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            result.executed.append(command)
        elif kw == "USER":
            result.user = expand(ins.args, env)
        elif kw == "EXPOSE":
            result.expose += ins.args.split()
        elif kw == "ENTRYPOINT":
            result.entrypoint = json.loads(ins.args)
        elif kw == "HEALTHCHECK":
            flags, rest = split_flags(ins.args)
            assert rest.startswith("CMD ["), f"line {ins.line}: HEALTHCHECK should use the exec form of CMD"
            result.healthcheck = json.loads(rest.removeprefix("CMD"))
        elif kw == "LABEL":
            pass
        else:
            raise AssertionError(f"line {ins.line}: {kw} is not modelled by this test; extend it")
    for name in args_only:
        env.pop(name, None)
    # What a container of this stage sees: the base environment plus the stage's ENV.
    return result


@dataclass
class Image:
    dockerfile: Dockerfile
    stages: dict[str, StageResult]
    context_files: list[str]
    final: StageResult
    venv: Path


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    tmp = tmp_path_factory.mktemp("image")
    df = parse_dockerfile(DOCKERFILE.read_text())
    context = tmp / "context"
    context_files = build_context(context)
    # Stands in for the base image's interpreter: the same Python, with pip and nothing else.
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "base-python")], check=True, timeout=300)
    base_env = base_environment(tmp / "base-python" / "bin")
    global_args = {name: value or "" for ins in df.global_args for name, value in parse_assignments(ins.args)}
    done: dict[str, StageResult] = {}
    for stage in df.stages:
        done[stage.name] = run_stage(stage, global_args, tmp / f"stage-{stage.name}", base_env, context, done)
    final = done[df.stages[-1].name]
    assert "VIRTUAL_ENV" in final.env, "the runtime stage should declare ENV VIRTUAL_ENV"
    return Image(df, done, context_files, final, Path(final.env["VIRTUAL_ENV"]))


def run_in_image(image: Image, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``docker run IMAGE args``: the ENTRYPOINT, found on the image's PATH, with its ENV."""
    exe = shutil.which(image.final.entrypoint[0], path=image.final.env["PATH"])
    assert exe is not None, f"{image.final.entrypoint[0]} is not on the image's PATH"
    return subprocess.run(
        [exe, *image.final.entrypoint[1:], *args],
        env=image.final.env,
        cwd=image.final.root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- tests --------------------------------------------------------------------------------------


def test_dockerignore_sends_only_what_the_build_needs(image: Image) -> None:
    rules = dockerignore_rules()
    for path in [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/fakenvml/.build/libnvidia-ml.so.1",
        "tests/test_rules.py",
        "benchmarks/results/core.md",
        "gpu_exporter.egg-info/PKG-INFO",
        "build/lib/x.py",
        "deploy/k8s/base/x",
        ".mypy_cache/x",
        "gpu_exporter/__pycache__/cli.cpython-311.pyc",
        "Dockerfile",
    ]:
        assert ignored(path, rules), f"{path} would be sent to the Docker daemon"
    tops = {p.split("/", 1)[0] for p in image.context_files}
    assert tops == {"pyproject.toml", "README.md", "gpu_exporter"}
    assert "gpu_exporter/cli.py" in image.context_files
    assert not any("__pycache__" in p for p in image.context_files)


def test_two_stages_on_a_slim_python_base(image: Image) -> None:
    assert [s.name for s in image.dockerfile.stages] == ["build", "runtime"]
    bases = {r.base for r in image.stages.values()}
    assert len(bases) == 1 and re.fullmatch(r"python:3\.\d+-slim", bases.pop()), bases
    # The build stage produced wheels; the runtime stage installed from them and copied nothing.
    assert any("pip wheel" in c for c in image.stages["build"].executed)
    runtime = image.dockerfile.stages[-1]
    assert not [i for i in runtime.instructions if i.keyword in {"COPY", "ADD"}]
    assert not (image.final.root / "src").exists() and not (image.final.root / "wheels").exists()


def test_every_run_line_was_executed_but_the_user_creation(image: Image) -> None:
    all_runs = [i for s in image.dockerfile.stages for i in s.instructions if i.keyword == "RUN"]
    executed = [c for r in image.stages.values() for c in r.executed]
    skipped = [c for r in image.stages.values() for c in r.not_executed]
    assert len(executed) + len(skipped) == len(all_runs)
    assert len(skipped) == 1 and "useradd" in skipped[0]
    uid = re.search(r"useradd\b.*--uid\s+(\d+)", skipped[0])
    gid = re.search(r"groupadd\b.*--gid\s+(\d+)", skipped[0])
    assert uid and gid
    assert image.final.user == f"{uid.group(1)}:{gid.group(1)}"
    assert int(uid.group(1)) >= 10000  # non-root, and outside host UID ranges


def test_version_through_the_entrypoint(image: Image) -> None:
    assert image.final.entrypoint == ["gpu-exporter"]
    exe = shutil.which("gpu-exporter", path=image.final.env["PATH"])
    assert exe is not None and Path(exe).parent == image.venv / "bin"
    out = run_in_image(image, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"gpu-exporter {PYPROJECT['project']['version']}"


def test_once_simulate_from_the_image(image: Image) -> None:
    table = run_in_image(image, "--once", "--simulate")
    assert table.returncode in (0, 1), table.stderr  # 1: the simulated workloads have findings
    assert "(simulated)" in table.stdout and "GPU 0" in table.stdout
    doc = run_in_image(image, "--once", "--simulate", "--simulate.gpus", "2", "--format", "json")
    assert doc.returncode in (0, 1), doc.stderr
    parsed = json.loads(doc.stdout)
    assert parsed["nvml_up"] is True and len(parsed["gpus"]) == 2


def venv_distributions(venv: Path) -> dict[str, Distribution]:
    site = next(venv.glob("lib/python3*/site-packages"))
    return {canonicalize_name(d.metadata["Name"]): d for d in distributions(path=[str(site)])}


def test_only_the_runtime_dependencies_are_installed(image: Image) -> None:
    installed = venv_distributions(image.venv)
    # The closure of gpu-exporter's requirements, markers evaluated for this Python, no extras.
    closure: set[str] = set()
    todo = ["gpu-exporter"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in closure:
            continue
        closure.add(name)
        for spec in installed[name].requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    assert set(installed) == closure
    test_extras = {
        canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["optional-dependencies"]["test"]
    }
    assert not test_extras & set(installed)
    assert "pip" not in installed  # the venv is made --without-pip


def test_test_only_packages_cannot_be_imported(image: Image) -> None:
    script = (
        "import importlib, json, gpu_exporter\n"
        "bad = {}\n"
        "for m in ['pytest', 'gpustat', 'mypy', 'ruff', 'promql_parser', 'kubernetes_validate', 'checkov']:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "        bad[m] = 'importable'\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "print(json.dumps({'bad': bad, 'pkg': gpu_exporter.__file__}))\n"
    )
    out = subprocess.run(
        [str(image.venv / "bin" / "python"), "-c", script],
        cwd=image.final.root,
        env=image.final.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bad"] == {}
    assert Path(result["pkg"]).is_relative_to(image.venv), "gpu_exporter must come from the image's venv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def daemon(image: Image) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    exe = shutil.which(image.final.entrypoint[0], path=image.final.env["PATH"])
    assert exe is not None
    proc = subprocess.Popen(
        [exe, "--simulate", "--web.listen-address", f"127.0.0.1:{port}"],
        env=image.final.env,
        cwd=image.final.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_healthcheck_answers_while_the_daemon_runs(image: Image, daemon: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = daemon
    assert image.final.expose == ["9445"]
    # The HEALTHCHECK targets the exposed port; here the daemon listens on a free one instead.
    command = [arg.replace(":9445/", f":{port}/") for arg in image.final.healthcheck]
    assert command != image.final.healthcheck and command[0] == "python"

    def check() -> int:
        return subprocess.run(
            command, env=image.final.env, cwd=image.final.root, capture_output=True, timeout=30
        ).returncode

    deadline = time.monotonic() + NEVER_S
    while check() != 0:
        assert proc.poll() is None, "the daemon exited"
        assert time.monotonic() < deadline, "HEALTHCHECK never succeeded"
        time.sleep(0.3)
    proc.terminate()
    proc.wait(timeout=NEVER_S)
    assert check() != 0, "HEALTHCHECK passes with no daemon"
