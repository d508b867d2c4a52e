"""quality/mutation.py's judgement of which mutants change only text, and of which survivors a reason explains.

A mutant wrongly taken for message text would vanish from the mutation score, so the line is pinned
here on hand-written mutants of the kinds mutmut makes.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import assert_mentions

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quality_mutation", ROOT / "quality" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


mutation = load()

ORIGINAL = """
def rule(g, r, log, Check):
    log.warning("notification_failed", receiver=g.name, status=g.code, alert=dict(g.labels))
    yield Check("GpuX", "warning", False, True, "", "", for_seconds=r.for_)
    temp = g.temp
    yield Check("GpuX", "warning", g.hot, not g.hot, summary=f"GPU {g.index} is hot",
                description=f"at {'n/a' if temp is None else f'{temp:.0f} C'} for {r.window / 60:g} min, {_pct(r.x)}",
                value=temp)
"""


def judged(old: str, new: str, message_function: bool = False) -> bool:
    mutant = ORIGINAL.replace(old, new, 1)
    assert mutant != ORIGINAL, f"{old!r} is not in the original"
    orig_fn, mutant_fn = (ast.parse(src).body[0] for src in (ORIGINAL, mutant))
    return bool(mutation.only_text(orig_fn, mutant_fn, message_function))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"notification_failed"', '"XXnotification_failedXX"'),  # a log event name
        ("status=g.code", "status=None"),  # a log field
        ("receiver=g.name, ", ""),  # a log field dropped
        ('f"GPU {g.index} is hot"', 'f"GPU {g.index} is HOT"'),  # the summary's words
        ("'n/a'", "'XXn/aXX'"),  # a literal inside the description
        ("r.window / 60", "r.window * 60"),  # arithmetic on a number the description shows
        ("r.window / 60", "r.window / 61"),
        ('"", "", for_seconds', '"XXXX", "", for_seconds'),  # the summary position of Check
    ],
)
def test_text_for_people_is_text(old: str, new: str) -> None:
    assert judged(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("alert=dict(g.labels)", "alert=dict(None)"),  # raises inside the log call, before logging
        ('summary=f"GPU {g.index} is hot"', "summary=None"),  # an alert without a summary
        ("_pct(r.x)", "_pct(None)"),  # raises while building the description
        ("if temp is None else", "if temp is not None else"),  # formats None: raises
        ("value=temp", "value=None"),  # what the alerts page shows
        ('"GpuX", "warning", g.hot', '"GpuX", "XXwarningXX", g.hot'),  # a label value
        ("False, True", "True, True"),  # the no-data check fires
    ],
)
def test_anything_that_can_raise_or_reaches_a_label_or_a_value_is_not_text(old: str, new: str) -> None:
    assert not judged(old, new)


def test_in_a_text_only_function_a_call_given_something_else_still_counts() -> None:
    pct = 'def _pct(v):\n    return f"{v * 100:.0f}% of {shorten(v.name)}"'

    def text(new: str) -> bool:
        return bool(mutation.only_text(ast.parse(pct).body[0], ast.parse(new).body[0], True))

    assert text(pct.replace("v * 100", "v / 100"))
    assert text(pct.replace("% of", "XX% ofXX"))
    assert not text(pct.replace("shorten(v.name)", "shorten(None)"))


def test_a_reason_explains_a_survivor_by_function_glob_and_exact_change_or_pattern() -> None:
    m = mutation.Mutant("pkg.mod.x_rule__mutmut_3", "rule", "survived", diff="--- a\n+++ b\n-    x < 1\n+    x <= 1")
    assert m.change == "x <= 1"
    known = {"mod": [{"function": "r*", "change": "x <= 1", "reason": "exact"}]}
    assert mutation.explain("mod", m, known) == "exact"
    known = {"mod": [{"function": "rule", "pattern": r"x <=? 1", "reason": "pattern"}]}
    assert mutation.explain("mod", m, known) == "pattern"
    known = {"mod": [{"function": "other", "change": "x <= 1", "reason": "no"},
                     {"function": "rule", "pattern": "x <= 2", "reason": "no"}]}  # fmt: skip
    assert mutation.explain("mod", m, known) == ""


def test_check_reads_the_committed_results_and_fails_on_a_survivor_without_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` runs no mutant: it judges the committed summary against survivors.toml, so CI can afford it."""
    survivors = tmp_path / "survivors.toml"
    survivors.write_text('[[window]]\nfunction = "mean"\nchange = "x <= 1"\nreason = "equivalent"\n')
    monkeypatch.setattr(mutation, "SURVIVORS", survivors)
    results = tmp_path / "results"
    results.mkdir()

    def write(*changes: str) -> None:
        module = {"module": "window", "path": "gpu_exporter/alerting/window.py", "score": 0.95,
                  "source_sha256": mutation.source_digest(mutation.TARGETS["window"]),
                  "survivors": [{"function": "mean", "change": c, "status": "survived"} for c in changes]}  # fmt: skip
        (results / "summary.json").write_text(json.dumps({"modules": [module]}))

    write("x <= 1")
    assert mutation.check(results, ["window"], 0.9)
    assert not mutation.check(results, ["window"], 0.96), "a score below --fail-under fails"
    write("x <= 1", "x < 2")
    assert not mutation.check(results, ["window"], 0.0)
    assert_mentions(capsys.readouterr().out, "survivor without a reason", "mean", "x < 2")
    assert not mutation.check(results, ["rules"], 0.0), "a module never measured fails"


def test_reuse_runs_a_test_file_added_to_the_target_since_the_last_run(tmp_path: Path) -> None:
    """``--reuse`` after adding tests: a new test file in the target's ``tests`` joins mutmut's test
    selection in the scratch copy, as a fresh run would have it, instead of never being run."""
    target = mutation.TARGETS["model"]
    work = tmp_path / "model"
    (work / "tests").mkdir(parents=True)
    (work / "mutants").mkdir()
    (work / "mutants" / "mutmut-stats.json").write_text("{}")
    config = work / "pyproject.toml"
    config.write_text('[project]\nname = "x"\n\n[tool.mutmut]\nonly_mutate = ["gpu_exporter/report/model.py"]\n'
                      'pytest_add_cli_args_test_selection = ["tests/test_report_html.py"]\n'
                      "use_git_change_detection = false\n")  # fmt: skip
    mutation.refresh_tests(work, target)
    assert all((work / t).is_file() for t in target.tests)
    selection = [ln for ln in config.read_text().splitlines() if ln.startswith("pytest_add_cli_args_test_selection")]
    assert selection == [f"pytest_add_cli_args_test_selection = {json.dumps(sorted(target.tests))}"]
    assert 'only_mutate = ["gpu_exporter/report/model.py"]' in config.read_text()
    assert not (work / "mutants" / "mutmut-stats.json").exists()  # mutmut records again which tests call what


@pytest.mark.parametrize(
    ("new", "text"),
    [('"XXGPU-hoursXX"', True), ('"gpu-hours"', True), ("None", False)],
)
def test_what_a_report_query_is_called_is_message_text_but_its_key_and_none_are_not(new: str, text: bool) -> None:
    """``Query(key, what, expr)``: ``what`` only names the query in progress lines; the key is read."""
    original = 'def queries(w):\n    return [Query("hours", "GPU-hours", f"sum({w})")]\n'
    mutant = original.replace('"GPU-hours"', new)
    fns = [ast.parse(src).body[0] for src in (original, mutant)]
    assert bool(mutation.only_text(*fns, False)) is text
    key = [ast.parse(src).body[0] for src in (original, original.replace('"hours"', '"XXhoursXX"'))]
    assert not mutation.only_text(*key, False)


@pytest.mark.parametrize(
    ("new", "text"),
    [
        ('"XXno answerXX"', True),  # the sentence of a failed call
        ('"XXsendingXX"', True),  # what the call was doing, for that sentence (a method's argument)
        ('"XXUNAVAILABLEXX"', False),  # the status code: the watcher's reason label
        ("None", False),  # a sentence replaced by None reaches the log as something else
    ],
)
def test_a_failed_calls_sentence_is_text_but_its_status_code_is_not(new: str, text: bool) -> None:
    """``RpcError(code, details)`` and ``self._timed_out(doing)``: the details and the doing are words
    for the operator; the code is what the watcher reports as the failure's reason."""
    original = (
        "def call(self, e):\n"
        '    if e:\n        raise RpcError("UNAVAILABLE", "no answer")\n'
        '    raise self._timed_out("sending")\n'
    )
    old = {'"XXno answerXX"': '"no answer"', '"XXsendingXX"': '"sending"', '"XXUNAVAILABLEXX"': '"UNAVAILABLE"',
           "None": '"no answer"'}[new]  # fmt: skip
    mutant = original.replace(old, new, 1)
    fns = [ast.parse(src).body[0] for src in (original, mutant)]
    assert bool(mutation.only_text(*fns, False)) is text
