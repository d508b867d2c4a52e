"""One holder model, everywhere holders are shown: per-GPU and per-process series, gpu_holder_info,
gpu_state_seconds_total's per-holder series, the alerts and /alerts, and --once's table and JSON.

A node of four GPUs: one held by a Slurm job (and its process), one shared by two containers (one
named with every trick a name can hold), one by a Unix user, one allocated to a job with nothing
running.  What the series say is read back with Prometheus's own parser and checked by promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.states import ALLOCATED_IDLE, BUSY, containers_of, holders, jobs_of
from gpu_exporter.alerting.engine import RuleEngine
from gpu_exporter.once import as_json, as_table, cost_now, findings, held_by
from gpu_exporter.serving.accounting_metrics import AccountingCollector
from gpu_exporter.serving.alerts_page import alerts_html, alerts_json
from gpu_exporter.serving.exposition import render_text
from gpu_exporter.serving.metrics import RenderOptions, SnapshotCollector
from gpu_exporter.snapshot import (
    ContainerRef,
    GpuReading,
    Holder,
    HolderLabels,
    JobRef,
    MigReading,
    NodeSnapshot,
    PodRef,
    ProcessReading,
    container_holder,
    device_holders,
    job_holder,
    user_holder,
)
from tests import assert_mentions
from tests.test_rules import GIB, STATIC, fast_rules

pytestmark = pytest.mark.integration

JOB = JobRef("4242", "alice", "ml", "gpu")
IDLE_JOB = JobRef("4250")
TRAINER = ContainerRef("docker", "a" * 64, "trainer")
EVIL_NAME = 'evil"}\n# HELP x\x1b]0;pwned\x07<script>alert(1)</script>'
EVIL = ContainerRef("podman", "b" * 64, EVIL_NAME)
ALL_ON = RenderOptions(jobs=True, containers=True)


def reading(index: int, util: float, procs: tuple[ProcessReading, ...] = (), **kw: Any) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index}", up=True, static=STATIC, utilization_ratio=util,
                      memory_total_bytes=80 * GIB, memory_used_bytes=sum(p.used_memory_bytes or 0 for p in procs),
                      processes=procs, **kw)  # fmt: skip


def node(t: float = 1_800_000_000.0, monotonic: float = 100.0) -> NodeSnapshot:
    p_job = ProcessReading(100, "python3", 70 * GIB, user="alice", job=JOB, sm_utilization_ratio=0.9)
    p_trainer = ProcessReading(200, "train", 30 * GIB, user="root", container=TRAINER, sm_utilization_ratio=0.3)
    p_evil = ProcessReading(201, "x", 10 * GIB, user="root", container=EVIL, sm_utilization_ratio=0.1)
    p_bob = ProcessReading(300, "jupyter", 5 * GIB, user="bob", sm_utilization_ratio=0.0)
    gpus = (
        reading(0, 0.95, (p_job,), jobs=(JOB,)),
        reading(1, 0.6, (p_trainer, p_evil), containers=(TRAINER, EVIL)),
        reading(2, 0.01, (p_bob,)),
        reading(3, 0.0, jobs=(IDLE_JOB,)),
    )
    return NodeSnapshot(taken_at=t, monotonic_at=monotonic, duration_seconds=0.01, nvml_up=True, gpus=gpus)


def exposition(snapshot: NodeSnapshot, books: Accountant | None = None, opts: RenderOptions = ALL_ON) -> bytes:
    registry = CollectorRegistry()
    collector = SnapshotCollector(opts)
    collector.snapshot = snapshot
    registry.register(collector)
    if books is not None:
        registry.register(AccountingCollector(books.view, opts))
    return render_text(registry)


def samples(body: bytes, name: str) -> list[dict[str, str]]:
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    family = fams[name.removesuffix("_total")]
    return [dict(s.labels, value=str(s.value)) for s in family.samples]


def test_the_holder_model_names_each_kind() -> None:
    assert job_holder(JOB).labels() == {"hpc_job": "4242", "user": "alice", "slurm_account": "ml",
                                        "slurm_partition": "gpu"}  # fmt: skip
    assert job_holder(JOB).name == "job 4242 of alice" and job_holder(IDLE_JOB).name == "job 4250"
    assert container_holder(TRAINER).name == "container trainer"
    assert container_holder(ContainerRef("containerd", "c" * 64)).name == "container cccccccccccc"
    assert user_holder("bob").name == "user bob" and Holder("pod", ("ml", "a", "main")).name == "pod ml/a"
    assert held_by([job_holder(JOB), user_holder("bob"), user_holder("carol"), user_holder("dan")], most=2) == (
        "job 4242 of alice, user bob, +2 more"
    )
    assert held_by([]) == "-"


def test_per_gpu_and_per_process_series_name_their_holders() -> None:
    body = exposition(node())
    util = {s["gpu"]: s for s in samples(body, "gpu_utilization_ratio")}
    assert (util["0"]["hpc_job"], util["0"]["container_name"]) == ("4242", "")
    assert util["1"]["container_name"] == ",".join(sorted(["trainer", EVIL_NAME]))  # a shared GPU: both, joined
    assert (util["2"]["hpc_job"], util["2"]["container_name"]) == ("", "")  # a user's: no job, no container
    assert util["3"]["hpc_job"] == "4250"  # allocated with nothing running: still the job's
    procs = {s["pid"]: s for s in samples(body, "gpu_process_memory_used_bytes")}
    assert (procs["100"]["hpc_job"], procs["100"]["user"]) == ("4242", "alice")
    assert procs["200"]["container_name"] == "trainer" and procs["201"]["container_name"] == EVIL_NAME
    assert procs["300"]["user"] == "bob" and procs["300"]["hpc_job"] == procs["300"]["container_name"] == ""


def test_gpu_holder_info_lists_every_holder_with_its_kind_and_labels() -> None:
    info = [{k: v for k, v in s.items() if v and k != "value"} for s in samples(exposition(node()), "gpu_holder_info")]
    assert {
        "gpu": "0", "uuid": "GPU-0", "kind": "job", "hpc_job": "4242", "user": "alice", "slurm_account": "ml",
        "slurm_partition": "gpu", "device_uuid": "GPU-0",
    } in info  # fmt: skip
    assert {"gpu": "1", "uuid": "GPU-1", "kind": "container", "container_engine": "docker",
            "container_id": "a" * 12, "container_name": "trainer", "device_uuid": "GPU-1"} in info  # fmt: skip
    assert {"gpu": "2", "uuid": "GPU-2", "kind": "user", "user": "bob", "device_uuid": "GPU-2"} in info
    assert {"gpu": "3", "uuid": "GPU-3", "kind": "job", "hpc_job": "4250", "device_uuid": "GPU-3"} in info
    assert len(info) == 5


def test_the_books_keep_each_holders_time_under_its_own_labels() -> None:
    books = Accountant(threshold=0.1)
    books.observe(node(monotonic=100.0))
    books.observe(node(t=1_800_000_010.0, monotonic=110.0))
    rows = [s for s in samples(exposition(node(), books), "gpu_state_seconds_total") if float(s["value"])]
    by = {(s["gpu"], s["hpc_job"] or s["container_name"] or s["user"], s["state"]): float(s["value"]) for s in rows}
    assert by[("0", "4242", BUSY)] == 10.0
    # The shared GPU's time split by the SM utilization of each container's process (0.3 : 0.1).
    assert by[("1", "trainer", BUSY)] == pytest.approx(7.5) and by[("1", EVIL_NAME, BUSY)] == pytest.approx(2.5)
    assert by[("2", "bob", ALLOCATED_IDLE)] == 10.0
    assert by[("3", "4250", ALLOCATED_IDLE)] == 10.0  # allocated, nothing ran: the job's waste
    job = next(s for s in rows if s["hpc_job"] == "4242")
    assert (job["user"], job["slurm_account"], job["slurm_partition"]) == ("alice", "ml", "gpu")
    trainer = next(s for s in rows if s["container_name"] == "trainer")
    assert (trainer["container_engine"], trainer["container_id"], trainer["user"]) == ("docker", "a" * 12, "")


def test_a_job_with_a_process_and_its_allocation_are_one_holder() -> None:
    g = reading(0, 0.5, (ProcessReading(1, "p", GIB, user="alice", job=JOB, sm_utilization_ratio=0.5),), jobs=(JOB,))
    assert holders(g, pod_mode=False) == [(job_holder(JOB), 1.0)]
    # A job allocated beside a user's stray process: the GPU's time is shared by both.
    g = reading(0, 0.5, (ProcessReading(2, "p", GIB, user="bob", sm_utilization_ratio=0.5),), jobs=(IDLE_JOB,))
    assert dict(holders(g, pod_mode=False)) == {job_holder(IDLE_JOB): 0.5, user_holder("bob"): 0.5}


def test_jobs_and_containers_beyond_the_bound_count_as_other_of_their_kind() -> None:
    books = Accountant(threshold=0.1, max_users=2)
    for t in range(5):
        jobs = tuple(JobRef(str(1000 + t * 3 + i)) for i in range(3))
        g = reading(0, 0.0, jobs=jobs)
        books.observe(NodeSnapshot(taken_at=t * 10.0, monotonic_at=t * 10.0, duration_seconds=0, nvml_up=True,
                                   gpus=(g,)))  # fmt: skip
    (account,) = books.view().gpus
    named = {h.get("hpc_job") for h, _, v in account.seconds if h.kind == "job"}
    # Two jobs of their own, the rest as one "other" job; each poll's first two take the places of
    # jobs gone by then (places go by GPU time, not arrival: tests/test_ledger_squatters.py).
    assert named == {"1012", "1013", "other"}
    assert Holder("job", ("other", "", "", "")) in {h for h, _, _ in account.seconds}


def test_promtool_accepts_the_page_with_every_kind_of_holder() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    books = Accountant(threshold=0.1)
    books.observe(node(monotonic=100.0))
    books.observe(node(monotonic=105.0))
    body = exposition(node(), books)
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert b"\n# HELP x" not in body  # the name's newline stays inside its value, escaped


def test_alerts_carry_the_holder_labels_and_the_page_says_who_holds_the_gpu() -> None:
    rules = fast_rules(GpuUnderutilized={"for": "0s", "window": "30s"},
                       GpuIdle={"enabled": True, "for": "0s", "window": "30s"})  # fmt: skip
    e = RuleEngine(rules, "node-a", jobs=True, containers=True)
    for step in range(4):
        e.evaluate(node(monotonic=100.0 + 15 * step))
    by_gpu = {a.label_dict["gpu"]: a for a in e.active()}
    assert by_gpu["2"].label_dict["alertname"] == "GpuUnderutilized"
    assert by_gpu["2"].label_dict.get("hpc_job") is None  # no empty label is sent
    assert by_gpu["3"].label_dict["hpc_job"] == "4250"
    doc = json.loads(alerts_json(e.active()))
    assert {"hpc_job": "4250"}.items() <= next(a["labels"] for a in doc["data"]["alerts"]
                                               if a["labels"]["gpu"] == "3").items()  # fmt: skip
    page = alerts_html(e.active(), holders=HolderLabels(None, jobs=True, containers=True)).decode()
    assert "<th>held by</th>" in page and "<td>job 4250</td>" in page
    shown = alerts_html(e.active()).decode()
    assert "<td>job 4250</td>" in shown  # the page's default knows every holder label
    # A container's name is escaped on the page.
    e2 = RuleEngine(fast_rules(GpuUnderutilized={"for": "0s", "window": "30s"}), "node-a", containers=True)
    evil = NodeSnapshot(
        taken_at=0,
        monotonic_at=0,
        duration_seconds=0,
        nvml_up=True,
        gpus=(
            reading(1, 0.01, (ProcessReading(201, "x", 10 * GIB, user="root", container=EVIL),), containers=(EVIL,)),
        ),
    )
    for step in range(4):
        e2.evaluate(NodeSnapshot(taken_at=0, monotonic_at=15.0 * step, duration_seconds=0, nvml_up=True,
                                 gpus=evil.gpus))  # fmt: skip
    html = alerts_html(e2.active()).decode()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_once_names_the_holders_in_its_table_and_json() -> None:
    snap = node()
    found = findings(snap)
    cost = cost_now(snap)
    table = as_table(snap, found, cost, node="n1")
    rows = {line.split()[0]: line for line in table.splitlines() if line[:4].strip().isdigit()}
    assert rows["0"].rstrip().endswith("job 4242 of alice")
    assert rows["3"].rstrip().endswith("job 4250")
    assert rows["2"].rstrip().endswith("user bob")
    held = [line for line in table.splitlines() if line.strip().startswith("held by ")]
    (job,) = [line for line in held if "job 4242" in line]
    assert_mentions(job, "of alice", "account ml", "partition gpu")
    (container,) = [line for line in held if "container trainer" in line]
    assert_mentions(container, "engine docker", "id aaaaaaaaaaaa")
    assert "\x1b" not in table and "\\x1b]0;pwned\\x07" in table  # the hostile name, inert
    doc = json.loads(as_json(snap, found, ALL_ON, cost, node="n1"))
    g0 = doc["gpus"][0]
    assert "hpc_job" not in g0["gpu_info"] and g0["gpu_utilization_ratio"] == 0.95  # GPU values stay values
    # Every entry has every key of its metric, null where this holder has no such label.
    none = dict.fromkeys(("container_engine", "container_id", "container_name", "uid", "claim_namespace",
                          "claim_name"))  # fmt: skip
    job_labels = {"hpc_job": "4242", "slurm_account": "ml", "slurm_partition": "gpu", "user": "alice", "kind": "job"}
    assert g0["gpu_holder_info"] == [none | job_labels | {"device_uuid": "GPU-0", "value": 1}]
    assert doc["gpus"][1]["gpu_process_memory_used_bytes"][0] == {
        "hpc_job": None, "container_name": "trainer", "pid": 200, "process": "train", "user": "root",
        "value": 30 * GIB}  # fmt: skip
    assert doc["gpus"][2]["gpu_process_memory_used_bytes"][0] == {
        "hpc_job": None, "container_name": None, "pid": 300, "process": "jupyter", "user": "bob",
        "value": 5 * GIB}  # fmt: skip


def test_device_holders_follow_pod_mode() -> None:
    g = node().gpus[0]
    assert device_holders(g, pod_mode=True) == ()  # with pod attribution, only pods hold GPUs
    assert device_holders(g, pod_mode=False) == (job_holder(JOB),)
    held = GpuReading(index=0, uuid="GPU-0", up=True, pods=(PodRef("ml", "b", "main"), PodRef("ml", "a", "main")))
    assert device_holders(held, pod_mode=True) == (
        Holder("pod", ("ml", "a", "main")),
        Holder("pod", ("ml", "b", "main")),
    )


def test_two_users_on_one_gpu_are_both_on_its_alerts() -> None:
    procs = (ProcessReading(1, "a", GIB, user="carol"), ProcessReading(2, "b", GIB, user="bob"),
             ProcessReading(3, "c", GIB, user=None), ProcessReading(4, "d", GIB, user="bob"))  # fmt: skip
    assert HolderLabels(users=True).of(reading(0, 0.0, procs)) == ("bob,carol",)  # "unknown" is no name


def test_pod_info_keeps_its_own_labels_beside_the_other_holders() -> None:
    """With pods and jobs both on, gpu_pod_info is still one pod per series, with its device."""
    pod = PodRef("ml", "train-0", "main")
    g = reading(0, 0.9, (ProcessReading(1, "p", GIB, pod=pod),), pods=(pod,), jobs=(JOB,))
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True, gpus=(g,))
    body = exposition(snap, opts=RenderOptions(pod_labels=("namespace", "pod", "container"), jobs=True))
    (info,) = samples(body, "gpu_pod_info")
    assert info == {"gpu": "0", "uuid": "GPU-0", "namespace": "ml", "pod": "train-0", "container": "main",
                    "device_uuid": "GPU-0", "value": "1"}  # fmt: skip
    (util,) = samples(body, "gpu_utilization_ratio")
    assert (util["pod"], util["hpc_job"]) == ("train-0", "4242")
    (holder,) = samples(body, "gpu_holder_info")  # with pod attribution, the pods are the holders
    assert (holder["kind"], holder["pod"], holder["hpc_job"]) == ("pod", "train-0", "")


def test_the_holder_labels_each_source_adds_and_nothing_else() -> None:
    assert HolderLabels().names == () and HolderLabels().detail_names == ("user",)
    assert HolderLabels(jobs=True).names == ("hpc_job",)
    assert HolderLabels(jobs=True).detail_names == ("hpc_job", "slurm_account", "slurm_partition", "user")
    assert HolderLabels(containers=True).detail_names == ("container_engine", "container_id", "container_name", "user")
    assert HolderLabels(("k8s_ns", "k8s_pod", "k8s_c")).detail_names == ("k8s_ns", "k8s_pod", "k8s_c", "user")
    assert HolderLabels(jobs=True).detail_values(job_holder(JOB)) == ("4242", "ml", "gpu", "alice")
    assert HolderLabels(containers=True).detail_values(container_holder(TRAINER)) == ("docker", "a" * 12, "trainer",
                                                                                        "")  # fmt: skip
    # Two jobs share a GPU: both, joined in a stable order, each once.
    both = HolderLabels(jobs=True).values((), (JobRef("4300"), JobRef("4242"), JobRef("4300", "bob")))
    assert both == ("4242,4300",)
    with pytest.raises(ValueError):
        Holder("job", ("4242",)).labels()  # a kind's labels are all there, or it is no holder


def test_a_gpus_holders_include_its_mig_devices_unless_asked_for_the_gpu_alone() -> None:
    mig = MigReading(index=0, uuid="MIG-1", profile="1g.10gb", gpu_instance_id=1, compute_instance_id=0,
                     jobs=(IDLE_JOB,), containers=(TRAINER,))  # fmt: skip
    g = reading(0, 0.5, (ProcessReading(1, "p", GIB, user="bob"),), migs=(mig,), containers=(EVIL,))
    assert device_holders(g, pod_mode=False) == (job_holder(IDLE_JOB), user_holder("bob"))
    assert device_holders(g, pod_mode=False, migs=False) == (user_holder("bob"),)
    assert device_holders(mig, pod_mode=False) == (job_holder(IDLE_JOB),)
    assert containers_of(g) == (TRAINER, EVIL) and jobs_of(g) == (IDLE_JOB,)


def test_the_books_name_a_gpus_jobs_and_containers_until_it_is_lost() -> None:
    books = Accountant(threshold=0.1)
    books.observe(node(monotonic=100.0))
    accounts = {a.index: a for a in books.view().gpus}
    assert accounts[0].jobs == (JOB,) and accounts[1].containers == (TRAINER, EVIL)
    lost = GpuReading(index=0, uuid="GPU-0", up=False, error="lost", jobs=(JOB,), containers=(TRAINER,))
    books.observe(NodeSnapshot(taken_at=0, monotonic_at=105.0, duration_seconds=0, nvml_up=True, gpus=(lost,)))
    (down,) = [a for a in books.view().gpus if a.index == 0]
    assert (down.jobs, down.containers, down.state) == ((), (), "down")


def test_alerts_carry_only_the_holder_labels_of_the_sources_that_are_on() -> None:
    rules = fast_rules(GpuIdle={"enabled": True, "for": "0s", "window": "30s"})
    e = RuleEngine(rules, "node-a")  # neither jobs nor containers on
    for step in range(4):
        e.evaluate(node(monotonic=100.0 + 15 * step))
    (idle,) = [a for a in e.active() if a.label_dict["gpu"] == "3"]
    assert "hpc_job" not in idle.label_dict and "container_name" not in idle.label_dict
    assert e.holders == HolderLabels(users=True)  # without pods, the users holding a GPU are named
    e = RuleEngine(rules, "node-a", pod_labels=("ns", "p", "c"))
    assert e.holders == HolderLabels(("ns", "p", "c"))


def test_a_unix_user_holding_a_gpu_is_on_its_alert_and_the_page() -> None:
    """--once says "user bob" for GPU 2; its alert and /alerts say so too (they said "held by -")."""
    rules = fast_rules(GpuIdle={"enabled": True, "for": "0s", "window": "30s"},
                       GpuUnderutilized={"for": "0s", "window": "30s"})  # fmt: skip
    e = RuleEngine(rules, "node-a", jobs=True, containers=True)
    for step in range(4):
        e.evaluate(node(monotonic=100.0 + 15 * step))
    alerts = {a.label_dict["gpu"]: a for a in e.active()}
    assert alerts["2"].label_dict["alertname"] == "GpuUnderutilized" and alerts["2"].label_dict["user"] == "bob"
    # A job's or a container's user is not the holder: those alerts carry their own labels, no user.
    assert "user" not in alerts["3"].label_dict and alerts["3"].label_dict["hpc_job"] == "4250"
    page = alerts_html([alerts["2"]], holders=e.holders).decode()
    assert "user bob" in page and "<td>-</td>" not in page
    assert held_by(device_holders(node().gpus[2], False)) == "user bob"  # what --once says
    # With pods the pod names the holder; no user label.
    pods = RuleEngine(rules, "node-a", pod_labels=("namespace", "pod", "container"))
    for step in range(4):
        pods.evaluate(node(monotonic=100.0 + 15 * step))
    assert all("user" not in a.label_dict for a in pods.active())
