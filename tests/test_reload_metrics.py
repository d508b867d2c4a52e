"""A failed configuration reload can be alerted on: ``gpu_exporter_config_reload_failures_total``
counts every SIGHUP that changed nothing, and ``gpu_exporter_config_last_reload_success_timestamp_seconds``
says when the configuration in force was loaded (at start, then at each good reload), as Prometheus's
``prometheus_config_*`` do.  The daemon runs in this process, never started: the reload path is
``cli.reload``, what the SIGHUP handler's loop calls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.cli import reload
from gpu_exporter.daemon import Daemon
from gpu_exporter.metric_defs import METRICS
from gpu_exporter.settings.config import ConfigError, Settings, load_settings
from gpu_exporter.sources.simulated import SimulatedBackend

FAILURES = "gpu_exporter_config_reload_failures_total"
LOADED_AT = "gpu_exporter_config_last_reload_success_timestamp_seconds"


def settings(**extra: Any) -> Settings:
    return load_settings({"simulate": True, **extra})


@pytest.fixture
def daemon() -> Daemon:
    return Daemon(settings(), lambda errors: SimulatedBackend(1))


def scraped(d: Daemon) -> dict[str, tuple[str, float]]:
    """What /metrics serves now: each of the two families' help and value."""
    out = {}
    for family in text_string_to_metric_families(d.exposition.body().decode()):
        for sample in family.samples:
            if sample.name in (FAILURES, LOADED_AT):
                out[sample.name] = (family.documentation, sample.value)
    return out


def failures(d: Daemon) -> float:
    return scraped(d)[FAILURES][1]


def loaded_at(d: Daemon) -> float:
    return scraped(d)[LOADED_AT][1]


def test_both_exist_from_the_start_with_the_declared_help() -> None:
    before = time.time()
    d = Daemon(settings(), lambda errors: SimulatedBackend(1))
    after = time.time()
    got = scraped(d)
    assert got[FAILURES] == (METRICS[FAILURES].help, 0.0)  # at 0, so that increase() sees the first failure
    assert got[LOADED_AT][0] == METRICS[LOADED_AT].help
    assert before <= got[LOADED_AT][1] <= after  # the configuration loaded at start


def test_a_good_reload_sets_the_time_and_counts_nothing(daemon: Daemon) -> None:
    scraped(daemon)  # rendered: the reload must make the next scrape render again
    daemon.reload(settings(rules={"GpuLost": {"for": "1m"}}), now=1_900_000_000.0)
    assert loaded_at(daemon) == 1_900_000_000.0 and failures(daemon) == 0
    assert daemon.settings.rules.GpuLost.for_ == 60


def test_a_failed_reload_is_counted_and_keeps_the_time_of_the_last_good_one(daemon: Daemon, tmp_path: Path) -> None:
    daemon.reload(settings(), now=1_900_000_000.0)
    scraped(daemon)  # a scrape renders the page; the next must not be served stale

    def bad_rules() -> Settings:
        return settings(rules={"GpuPcieBottleneck": {"threshold": 0.8, "clear_threshold": 0.9}})

    reload(daemon, bad_rules)  # a setting refused (ConfigError)
    assert failures(daemon) == 1 and loaded_at(daemon) == 1_900_000_000.0
    assert daemon.settings.rules.GpuPcieBottleneck.clear_threshold == 0.7  # the running configuration stays

    reload(daemon, lambda: settings(web_config_file=tmp_path / "missing.yml"))  # the daemon refuses it
    assert failures(daemon) == 2 and loaded_at(daemon) == 1_900_000_000.0

    def broken() -> Settings:
        raise RuntimeError("surprise")

    reload(daemon, broken)  # anything else: still counted, never fatal
    reload(daemon, None)  # no configuration to read again
    assert failures(daemon) == 4 and loaded_at(daemon) == 1_900_000_000.0


def test_a_good_reload_after_failures_moves_the_time_on_and_leaves_the_count(daemon: Daemon) -> None:
    def refused() -> Settings:
        raise ConfigError("invalid rules.GpuLost.for")

    reload(daemon, refused)
    start = loaded_at(daemon)
    before = time.time()
    reload(daemon, lambda: settings(rules={"GpuLost": {"for": "45s"}}))
    assert start <= before <= loaded_at(daemon) <= time.time()  # the real clock, where none is given
    assert failures(daemon) == 1  # a counter: the alert is on its increase since the last success
    assert daemon.settings.rules.GpuLost.for_ == 45
