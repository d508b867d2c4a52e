"""alerts/gpu-report.rules.yml is what the report's recorded path reads: each rule is the raw query's
expression of one step at a step of an hour (gpu_exporter/report/queries.py ``rules``), and the report
takes the recorded path only for ranges the hourly series can tile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_exporter.report import queries
from gpu_exporter.report.command import _recorded_mode, build_parser
from gpu_exporter.report.queries import HOUR, recorded_window
from gpu_exporter.report.settings import ReportConfigError
from gpu_exporter.report.settings import load as load_report

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts" / "gpu-report.rules.yml"


def _flat(expr: str) -> str:
    return " ".join(expr.split())


def test_the_rule_file_holds_the_expressions_the_report_reads() -> None:
    doc = yaml.safe_load(RULES.read_text())
    shipped = {r["record"]: _flat(r["expr"]) for g in doc["groups"] for r in g["rules"]}
    assert shipped == {name: _flat(expr) for name, expr in queries.rules().items()}
    assert [g["interval"] for g in doc["groups"]] == ["1h"]


def test_the_rules_compute_what_a_raw_step_of_an_hour_does() -> None:
    """Over 30 days the raw path steps by an hour; its per-step expressions are the rules' inner ones."""
    end = 1_800_000_000 // HOUR * HOUR
    w = queries.window_for(end - 720 * HOUR, end)
    assert w.step == HOUR and w.offset == 0
    hours = queries.hours(w, "").expr
    step = queries.counted("gpu_state_seconds_total", w)  # across a scrape gap (issue 48)
    assert f"sum_over_time(({step})[2591999999ms:3600s])" in hours
    assert queries.rules()[queries.REC_STATE] == f"last_over_time(({step})[1h:1h] offset 1h)"
    assert "last_over_time(gpu_state_seconds_total[3600s] offset 3600s)" in step
    raw_activity = next(q.expr for q in queries.queries(w, "") if q.key == "activity")
    assert queries.held_activity(queries._Tiles(w, "")) in raw_activity


def test_only_ranges_of_whole_hours_from_a_day_to_thirty_days_are_read_recorded() -> None:
    h = 1_800_000_000 // HOUR * HOUR
    assert recorded_window(h - 24 * HOUR, h) == queries.Window(h - 24 * HOUR, h, HOUR)
    assert recorded_window(h - 720 * HOUR, h) is not None
    assert recorded_window(h - 721 * HOUR, h) is None
    assert recorded_window(h - 23 * HOUR, h) is None
    assert recorded_window(h - 48 * HOUR + 60, h) is None
    assert recorded_window(h - 48 * HOUR, h - 60) is None


def test_a_recorded_query_reads_each_hour_from_the_sample_recorded_after_it() -> None:
    h = 1_800_000_000 // HOUR * HOUR
    w = queries.Window(h - 48 * HOUR, h, HOUR)
    q = queries.hours(w, '{cluster="eu"}'[1:-1], recorded=True)
    assert q.at == h + queries.LAG
    assert 'sum_over_time(gpu:report_state_seconds:hour{cluster="eu"}[172800s] offset 1ms)' in q.expr
    twice = queries.hours(w, "", copies=True, recorded=True)  # each hour's copies compared: step by step
    own = f'uuid!="", job=~"{queries.OWN_JOB}"'
    assert f"(last_over_time(gpu:report_state_seconds:hour{{{own}}}[1h] offset 1ms))" in twice.expr
    # Other jobs' copies only at hours the exporter's own job did not see the GPU (its "down" figure).
    assert f'unless on (node, gpu, uuid) last_over_time(gpu:report_down:hour{{{own}, state="down"}}[1h]' in twice.expr
    t = queries.timeline(w, "", recorded=True)
    assert t.kind == "range" and t.shift == queries.LAG


def test_the_path_is_the_flag_else_the_config_files_report_section_else_auto(tmp_path: Path) -> None:
    url = ["--prometheus.url", "http://127.0.0.1:9"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"report": {"recorded": "no"}}))
    assert _recorded_mode(build_parser().parse_args(url)) == "auto"
    assert _recorded_mode(build_parser().parse_args([*url, "--config", str(path)])) == "no"
    assert _recorded_mode(build_parser().parse_args([*url, "--config", str(path), "--prometheus.recorded", "yes"])) \
        == "yes"  # fmt: skip
    path.write_text(yaml.safe_dump({"report": {"recorded": "always"}}))
    with pytest.raises(ReportConfigError, match=r"report\.recorded"):
        load_report(path)


def _recorded_queries(matchers: str) -> list[queries.Query]:
    h = 1_800_000_000 // HOUR * HOUR
    w = queries.Window(h - 48 * HOUR, h, HOUR)
    return [*queries.recorded_queries(w, matchers), queries.hours(w, matchers, recorded=True),
            queries.hours(w, matchers, 3, 20, recorded=True), queries.hours(w, matchers, copies=True, recorded=True),
            queries.exact_cost(w, matchers, ["GPU-1"], "USD", recorded=True),
            queries.exact_cost(w, matchers, ["GPU-1"], "USD", copies=True, recorded=True),
            queries.timeline(w, matchers, recorded=True),
            queries.timeline(w, matchers, copies=True, recorded=True)]  # fmt: skip


def test_every_recorded_query_reads_the_rules_series_narrowed_by_the_selector() -> None:
    """As the raw queries (test_report_queries): each selector carries --selector's matchers, and reads
    a series the rule file records, but for who holds each GPU now (the raw series' last hour)."""
    import promql_parser as pp

    from tests.test_report_queries import matchers_of, selectors

    recorded = set(queries.rules()) - {queries.REC_MARKER}
    read: set[str] = set()
    for q in _recorded_queries('node="n2", team!="ci"'):
        found = list(selectors(pp.parse(q.expr)))
        assert found, q.expr
        for v in found:
            assert {("node", "Equal", "n2"), ("team", "NotEqual", "ci")} <= matchers_of(v), q.expr
            read.add(str(v.name))
    # And, issue 48, the links of the range's last hour from the raw series (a few gauges).
    assert read == recorded | {"gpu_state_seconds_total", *queries.RECORDED_LINK_FACTS.values()}
    # Every cluster's rules: the marker, the hours and the GPUs seen (issue 48: the hours rule may fail alone).
    found = list(selectors(pp.parse(queries.coverage(queries.Window(0, 48 * HOUR, HOUR)))))
    assert {str(v.name) for v in found} == {queries.REC_MARKER, queries.REC_STATE, queries.REC_DOWN}
    assert all(matchers_of(v) <= {("state", "Equal", "down")} for v in found)


def test_the_recorded_queries_word_for_word() -> None:
    """What the recorded path asks over the 48 h ending at hour h, with --selector '{node="n2"}': each
    hour's one sample, read LAG after the range ends (tests/test_report_recorded.py checks on real
    Prometheus and VictoriaMetrics that they give the raw path's money to the cent; this pins the text)."""
    h = 1_800_000_000 // HOUR * HOUR
    w = queries.Window(h - 48 * HOUR, h, HOUR)
    n2 = 'node="n2"'
    gpu = "node, instance, gpu, uuid"
    holder = f"{gpu}, namespace, pod, hpc_job, container_engine, container_id, container_name, user"
    by = f"{holder}, gpu_instance_id"  # a MIG card's GPU instances keep their own hours and holders
    span = "[172800s] offset 1ms"
    hour = "[1h] offset 1ms"
    at = h + queries.LAG
    assert at == h + 7200
    got = {q.key: (q.kind, q.at, q.shift, q.expr) for q in queries.recorded_queries(w, n2)}

    def price(ms: int) -> str:  # each hour's price as ``hourly`` reads it, or the hour before's
        return (
            f"max by ({gpu}, currency) (last_over_time(gpu:report_price_per_hour:hour{{{n2}}}[1h] offset {ms}ms)) >= 0"
        )

    # Named in the progress lines as the raw path's queries are, saying which series they read.
    assert {q.key: q.what for q in queries.recorded_queries(w, n2)} == {
        "prices": "prices (recorded)", "priced_steps": "steps priced (recorded)",
        "seen": "GPUs seen, by target (recorded)", "info": "GPU models (recorded)",
        "memory_total": "memory sizes (recorded)", "memory_peak": "memory peaks (recorded)",
        "activity": "activity while held (recorded)", "holders_now": "holders now",
        "links": "links (NVLink, PCIe; the last hour)"}  # fmt: skip
    assert got == {
        "prices": ("range", None, 7200, f"({price(1)}) unless ((({price(1)}) == ({price(3600001)})) and on () "
                                        f"(vector(time()) > {w.start + HOUR + 7200}))"),
        "priced_steps": ("instant", at, 0, f"count_over_time((max by ({gpu}, currency) (last_over_time("
                                           f"gpu:report_price_per_hour:hour{{{n2}}}[1h] offset 1ms) >= 0))"
                                           "[172799999ms:1h])"),
        "seen": ("instant", at, 0, f"max without ({queries.EXPORTED}) (count_over_time("
                                   f"gpu:report_down:hour{{{n2}}}{span}))"),
        "info": ("instant", at, 0, f"max by ({gpu}, name, mig_mode) (max_over_time("
                                   f"gpu:report_info:hour{{{n2}}}{span}))"),
        "memory_total": ("instant", at, 0, f"max by ({gpu}) (max_over_time("
                                           f"gpu:report_memory_total_bytes:hour{{{n2}}}{span}))"),
        "memory_peak": ("instant", at, 0, f"max by ({gpu}) (max_over_time("
                                          f"gpu:report_memory_used_max_bytes:hour{{{n2}}}{span}))"),
        "activity": ("instant", at, 0, f"max by ({gpu}, signal) (quantile_over_time(0.95, "
                                       f"gpu:report_activity_held:hour{{{n2}}}{span}))"),
        "holders_now": ("instant", None, 0, f"max by ({by}) (stddev_over_time(gpu_state_seconds_total{{{n2}, "
                                            'state=~"busy|allocated_idle|allocated_unknown"}[3599999ms]) > bool 0)'),
        "links": ("instant", w.end, 0, f"max by ({gpu}, what) ("
                  + " or ".join(f'label_replace(max_over_time({m}{{{n2}}}[1h]), "what", "{k}", "", "")'
                                for k, m in queries.RECORDED_LINK_FACTS.items()) + ")"),
    }  # fmt: skip
    # An hour counts where the rules ran, the hours rule wrote something, and every GPU seen has its hours.
    written = 'last_over_time(gpu:report_state_seconds:hour{state="down"}[1h] offset 1ms)'
    assert queries.coverage(w) == (
        "count_over_time((max(last_over_time(gpu:report_rules:hour[1h] offset 1ms)) and on () "
        f"count({written}) unless on () count(last_over_time(gpu:report_down:hour[1h] offset 1ms) unless "
        f"{written}))[172799999ms:1h])"
    )
    whole = queries.hours(w, n2, recorded=True)
    assert (whole.key, whole.kind, whole.at) == ("hours", "instant", at)
    assert whole.expr == f"sum by ({by}, state) (sum_over_time(gpu:report_state_seconds:hour{{{n2}}}{span})) / 3600"
    piece = queries.hours(w, n2, 3, 20, recorded=True)  # 18 h, ending 28 h before the range does
    assert (piece.key, piece.at) == ("hours:3:20", at - 28 * HOUR)
    assert piece.expr == (f"sum by ({by}, state) (sum_over_time(gpu:report_state_seconds:hour{{{n2}}}[64800s] "
                          "offset 1ms)) / 3600")  # fmt: skip
    cost = queries.exact_cost(w, n2, ["GPU-1"], "USD", recorded=True)
    assert (cost.key, cost.at) == ("cost", at)
    assert cost.expr == (
        f"sum by ({by}, state, currency) (sum_over_time((last_over_time(gpu:report_state_seconds:hour"
        f'{{{n2}, uuid=~"GPU-1"}}{hour}) * on (job, instance, gpu, uuid) group_left (currency) max by (job, '
        f'instance, gpu, uuid, currency) (last_over_time(gpu:report_price_per_hour:hour{{{n2}, uuid=~"GPU-1", '
        f'currency="USD"}}{hour})))[172799999ms:3600s])) / 3600'
    )  # fmt: skip
    line = queries.timeline(w, n2, recorded=True)
    assert (line.kind, line.at, line.shift) == ("range", None, 7200)
    assert line.expr == f"sum by (state) (last_over_time(gpu:report_state_seconds:hour{{{n2}}}{hour})) / 3600"
    # Where a GPU was seen through two scrapers, each hour's copies are compared: hour by hour.
    twice = queries.hours(w, n2, copies=True, recorded=True)
    assert twice.at == at and twice.expr.endswith(")[172799999ms:3600s])) / 3600")
    own = f'uuid!="", job=~"{queries.OWN_JOB}"'
    assert f"sum without (instance) (last_over_time(gpu:report_state_seconds:hour{{{n2}, {own}}}{hour}))" \
        in twice.expr  # fmt: skip
    assert f'(last_over_time(gpu:report_state_seconds:hour{{{n2}, uuid=""}}{hour}))' in twice.expr
    # The same where the GPUs' prices changed and where the timeline is asked: each copy's own hours
    # and prices, compared hour by hour.
    priced = queries.exact_cost(w, n2, ["GPU-1"], "USD", copies=True, recorded=True).expr
    for u in (own, f'uuid!="", job!~"{queries.OWN_JOB}"', 'uuid=""'):  # the own job's, other jobs', no uuid
        assert f'last_over_time(gpu:report_state_seconds:hour{{{n2}, uuid=~"GPU-1", {u}}}{hour})' in priced
        assert f'gpu:report_price_per_hour:hour{{{n2}, uuid=~"GPU-1", {u}, currency="USD"}}{hour}' in priced
    both = queries.timeline(w, n2, copies=True, recorded=True)
    assert both.shift == queries.LAG and both.expr.startswith("sum by (state) (max by (node, gpu, uuid, ")
    for u in (own, f'uuid!="", job!~"{queries.OWN_JOB}"', 'uuid=""'):
        assert f"last_over_time(gpu:report_state_seconds:hour{{{n2}, {u}}}{hour})" in both.expr
