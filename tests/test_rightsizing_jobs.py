"""Issue 37: a job's GPUs are advised as one (how many cards, which interconnect, what the whole set
saves), the assumptions made for a missing signal are said, and the boundaries of "used" hold.

On a user's catalogue of made-up cards, so that each case has one right answer worked out by hand:
``Big`` is the card the work is on (4.00/h, 300 GB/s NVLink each way); ``Link`` has Big's rates and
NVLink at 3.00; ``Plain`` has them without NVLink at 2.00; ``NoFp64`` states no FP64 rate, at 1.00;
``Tiny`` is a tenth of Big at 0.50.  ``Ada`` states no FP64 and no FP16 (vector) rate, like an RTX
6000 Ada; ``AdaCheap`` has a third of its FP32 and ``AdaGood`` all of it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.report.catalogue import Catalogue, load_catalogue
from gpu_exporter.report.prices import PriceList
from gpu_exporter.report.rightsizing import CARD, RELEASE, SLOWER, Sizer, Usage
from tests import assert_mentions

GIB = 1024**3
BIG_RATES = {"fp16_tflops": 1000, "fp64_tflops": 30, "fp32_tflops": 60, "fp16_vector_tflops": 120,
             "memory_bandwidth_gbps": 3000}  # fmt: skip
CARDS: dict[str, dict[str, Any]] = {
    "Big": {"memory_gib": 80, **BIG_RATES, "nvlink_gbps": 600, "price_per_hour": 4.00},
    "Link": {"memory_gib": 80, **BIG_RATES, "nvlink_gbps": 600, "price_per_hour": 3.00},
    "Plain": {"memory_gib": 48, **BIG_RATES, "price_per_hour": 2.00},
    "NoFp64": {"memory_gib": 48, "fp16_tflops": 1000, "fp32_tflops": 60, "fp16_vector_tflops": 120,
               "memory_bandwidth_gbps": 3000, "price_per_hour": 1.00},
    "Tiny": {"memory_gib": 48, "fp16_tflops": 100, "fp64_tflops": 3, "fp32_tflops": 6, "fp16_vector_tflops": 12,
             "memory_bandwidth_gbps": 300, "price_per_hour": 0.50},
    "Thin": {"memory_gib": 80, **BIG_RATES, "nvlink_gbps": 2, "price_per_hour": 4.00},
    "Ada": {"memory_gib": 48, "fp16_tflops": 400, "fp32_tflops": 90, "memory_bandwidth_gbps": 960,
            "price_per_hour": 1.50},
    "AdaCheap": {"memory_gib": 48, "fp16_tflops": 400, "fp32_tflops": 30, "memory_bandwidth_gbps": 960,
                 "price_per_hour": 0.60},
    "AdaGood": {"memory_gib": 48, "fp16_tflops": 400, "fp32_tflops": 90, "memory_bandwidth_gbps": 960,
                "price_per_hour": 0.90},
}  # fmt: skip
IDLE_PIPES = {"tensor": 0.0, "fp64": 0.0, "fp32": 0.0, "fp16": 0.0}


def catalogue(tmp_path: Path, *names: str) -> Catalogue:
    cards = [{"name": n, "match": [f"^{n}$"], **CARDS[n]} for n in names]
    path = tmp_path / f"cards-{'-'.join(names)}.yaml"
    path.write_text(yaml.safe_dump({"currency": "USD", "cards": cards}))
    return load_catalogue(path)


def sizer(cat: Catalogue, **kw: Any) -> Sizer:
    return Sizer(cat, PriceList(cat, "USD", {}, None), **kw)


def gpu(index: str = "0", node: str = "n1", **kw: Any) -> Usage:
    """A GPU of job 4242 on a Big, busy for 720 h, with GPM and NVLink counters unless told."""
    base: dict[str, Any] = {
        "node": node, "gpu": index, "uuid": f"GPU-{node}-{index}", "model": "Big", "holder": "job 4242",
        "idle_holder": "", "busy_hours": 720.0, "allocated_idle_hours": 0.0, "idle_hours": 0.0, "down_hours": 0.0,
        "price_per_hour": 4.00, "memory_total_bytes": 80 * GIB, "memory_peak_bytes": 10 * GIB,
        "activity_p95": 0.30, "activity_signal": "SM activity", "dram_p95": 0.05,
        "pipes": IDLE_PIPES | {"tensor": 0.30}, "nvlink_bytes_per_second": 0.0,
    }  # fmt: skip
    return Usage(**(base | kw))


def job_of(n: int, **kw: Any) -> Usage:
    """``n`` GPUs of one job, as model.py hands them to the sizer (one GPU as itself)."""
    members = [gpu(str(i), **kw) for i in range(n)]
    got = members[0] if n == 1 else Sizer.together(members)
    assert got is not None
    return got


# -- a job as a whole ------------------------------------------------------------------------------------
def test_a_jobs_gpus_together_need_what_the_busiest_of_them_needed() -> None:
    """Eight GPUs on two nodes, listed out of order: one Usage naming them in order (GPU 2 before 10),
    each measure the highest of any, the price the cheapest, the history the shortest."""
    members = [
        gpu("10", "n1", memory_peak_bytes=30 * GIB, busy_hours=700.0),
        gpu("2", "n1", activity_p95=0.55, pipes=IDLE_PIPES | {"tensor": 0.50, "fp32": 0.02}),
        gpu("0", "n1", dram_p95=0.40, price_per_hour=3.50),
        gpu("1", "n1", nvlink_bytes_per_second=5e9, pipes=IDLE_PIPES | {"tensor": 0.10, "fp64": 0.20}),
        *(gpu(str(i), "n2") for i in (3, 0, 2, 1)),
    ]
    job = Sizer.together(members)
    assert job is not None
    assert job.count == 8
    assert job.gpu == "0, 1, 2, 10, 0, 1, 2, 3"
    assert job.node == "n1, n2"
    order = [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 10), *(("n2", i) for i in range(4))]
    assert job.uuid == ", ".join(f"GPU-{node}-{i}" for node, i in order)
    assert (job.memory_peak_bytes, job.activity_p95, job.dram_p95) == (30 * GIB, 0.55, 0.40)
    assert job.nvlink_bytes_per_second == 5e9
    assert job.pipes == {"tensor": 0.50, "fp64": 0.20, "fp32": 0.02, "fp16": 0.0}
    assert job.price_per_hour == 3.50
    assert job.busy_hours == 700.0  # the GPU seen least
    assert (job.holder, job.model) == ("job 4242", "Big")


@pytest.mark.parametrize(
    ("missing", "field"),
    [({"dram_p95": None}, "dram_p95"), ({"price_per_hour": None}, "price_per_hour"),
     ({"nvlink_bytes_per_second": None}, "nvlink_bytes_per_second"), ({"pipes": None}, "pipes"),
     ({"memory_peak_bytes": None}, "memory_peak_bytes"), ({"activity_p95": None}, "activity_p95")],
)  # fmt: skip
def test_a_measure_unknown_on_one_of_a_jobs_gpus_is_unknown_for_the_job(missing: dict[str, Any], field: str) -> None:
    job = Sizer.together([gpu("0"), gpu("1", **missing), gpu("2")])
    assert job is not None and getattr(job, field) is None


def test_a_pipe_one_gpu_does_not_report_is_unknown_for_the_job_not_zero() -> None:
    job = Sizer.together([gpu("0"), gpu("1", pipes={"tensor": 0.2, "fp32": 0.0, "fp16": 0.0})])
    assert job is not None and job.pipes == {"tensor": 0.30, "fp32": 0.0, "fp16": 0.0}


def test_gpus_of_other_models_or_holders_are_not_one_job() -> None:
    assert Sizer.together([gpu("0"), gpu("1", model="Link")]) is None
    assert Sizer.together([gpu("0"), gpu("1", mig_mode=True)]) is None
    assert Sizer.together([gpu("0"), gpu("1", holder="job 4243")]) is None


def test_gpus_that_are_not_numbered_come_after_the_numbered_by_name() -> None:
    """A MIG device or a name in place of an index sorts after every numbered GPU."""
    job = Sizer.together([gpu("1/2"), gpu("10"), gpu("1"), gpu("0/1")])
    assert job is not None and job.gpu == "1, 10, 0/1, 1/2"


@pytest.mark.parametrize("n", [1, 2, 8])
def test_a_job_is_told_how_many_cards_and_what_all_of_them_save(tmp_path: Path, n: int) -> None:
    """Tensor 30% of a Big (300 TFLOPS), no FP64, no NVLink traffic: a NoFp64 holds it at 1.00 instead
    of 4.00 a GPU; the set saves 3.00 x n x 730 a month."""
    cat = catalogue(tmp_path, "Big", "Link", "Plain", "NoFp64", "Tiny")
    a = sizer(cat).advise(job_of(n))
    assert a is not None and (a.kind, a.suggested) == (CARD, "NoFp64")
    assert a.saving_per_month == pytest.approx(3.00 * n * 730)
    assert_mentions(a.reason, "job 4242", "10.0 GiB", f"${3.00 * n * 730:,.0f}/month", "30% SM activity")
    gpus = ", ".join(map(str, range(n)))
    many = ("10.0 GiB per GPU on Big", "while held, the busiest of its GPUs)", f"{n} x NoFp64 hold that",
            "are at least as fast", "$1.00/h each", "instead of $4.00/h each", f"{n} GPUs: {gpus} on n1")  # fmt: skip
    one = ("10.0 GiB on Big", "an NoFp64 holds that", "is at least as fast", "$1.00/h (", "instead of $4.00/h; moving",
           "(GPU 0 on n1)")  # fmt: skip
    if n > 1:
        assert_mentions(a.reason, *many)
    else:
        assert_mentions(a.reason, *one)
        assert not any(fact in a.reason for fact in ("per GPU", "busiest", " x ", "/h each", " hold ", " are "))
    assert "None" not in a.reason


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_slower_card_for_a_job_gives_the_cost_of_the_whole_sets_work(tmp_path: Path, n: int) -> None:
    """Tensor 50% of a Big (500 TFLOPS) on a Tiny (100): 5.0x as long. 720 h of work: Tiny costs
    0.50 x 720 x 5 x n, Big 4.00 x 720 x n."""
    cat = catalogue(tmp_path, "Big", "Tiny")
    job = job_of(n, activity_p95=0.5, pipes=IDLE_PIPES | {"tensor": 0.5})
    assert sizer(cat).advise(job) is None  # slower only on request
    a = sizer(cat, allow_slower=True).advise(job)
    assert a is not None and (a.kind, a.suggested) == (SLOWER, "Tiny") and a.slowdown == pytest.approx(5.0)
    assert_mentions(a.reason, "5.0x as long", "720 h", "3,600 h", f"${0.5 * 720 * 5 * n:,.0f} instead of "
                    f"${4.0 * 720 * n:,.0f} for the same work")  # fmt: skip
    if n > 1:
        assert_mentions(a.reason, f"{n} x Tiny would hold it but are slower", "$0.50/h each", "$4.00/h each")
    else:
        assert_mentions(a.reason, "A Tiny would hold it but is slower", "$0.50/h (", "$4.00/h: ")
        assert "/h each" not in a.reason


# -- unknown is not zero, and said ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("signals", "missing"),
    [({"pipes": None, "dram_p95": None}, "no pipe and DRAM activity"),
     ({"pipes": None}, "no pipe activity"), ({"dram_p95": None}, "no DRAM activity")],
)  # fmt: skip
def test_the_advice_says_which_signal_it_lacked_and_what_it_assumed(tmp_path: Path, signals: dict[str, Any],
                                                                     missing: str) -> None:  # fmt: skip
    cat = catalogue(tmp_path, "Big", "Plain")
    a = sizer(cat).advise(gpu(activity_p95=0.30, activity_signal="GPU utilization", **signals))
    assert a is not None and a.suggested == "Plain"
    assert_mentions(a.reason, f"the GPU gives {missing}, so the work is taken to", "as busy as its 30% GPU utilization")
    for other in {"no pipe and DRAM activity", "no pipe activity", "no DRAM activity"} - {missing}:
        assert other not in a.reason


def test_an_idle_gpu_without_gpm_is_said_to_be_taken_as_idle_as_it_was(tmp_path: Path) -> None:
    a = sizer(catalogue(tmp_path, "Big", "Plain")).advise(gpu(activity_p95=0.0, pipes=None, dram_p95=None))
    assert a is not None and "as busy as its 0% SM activity" in a.reason


def test_unknown_nvlink_traffic_keeps_a_card_with_as_much_nvlink_and_says_so(tmp_path: Path) -> None:
    """No NVLink counters and no GPM on a Big: only a card with Big's 300 GB/s each way may hold it
    (Link, exactly as much); both assumptions are said, one after the other."""
    cat = catalogue(tmp_path, "Big", "Link", "Plain", "NoFp64")
    a = sizer(cat).advise(gpu(nvlink_bytes_per_second=None, pipes=None, dram_p95=None,
                              activity_signal="GPU utilization"))  # fmt: skip
    assert a is not None and a.suggested == "Link"
    assert_mentions(a.reason, "30% GPU utilization; its NVLink traffic is unknown",
                    "only cards with NVLink at least as fast as a Big's are considered")  # fmt: skip
    # A card with any NVLink at all (Thin: 1 GB/s each way) makes unknown traffic an assumption to say.
    thin = sizer(catalogue(tmp_path, "Thin", "Link", "Plain")).advise(gpu(model="Thin", nvlink_bytes_per_second=None))
    assert thin is not None and thin.suggested == "Link"
    assert_mentions(thin.reason, "NVLink traffic is unknown", "as fast as a Thin's")


def test_with_every_signal_known_nothing_is_said_to_be_assumed(tmp_path: Path) -> None:
    a = sizer(catalogue(tmp_path, "Big", "Plain")).advise(gpu(dram_p95=None))
    b = sizer(catalogue(tmp_path, "Big", "Plain")).advise(gpu())
    assert a is not None and b is not None
    assert "taken to" in a.reason and "taken to" not in b.reason and "unknown" not in b.reason
    for told in (a, b):
        assert "while held); " in told.reason and "; ;" not in told.reason, told.reason
    # Without DRAM activity the advice names only the signal it had.
    assert "30% SM activity, pipes tensor 30%" in a.reason
    assert "SM activity and 5% DRAM bandwidth, pipes" in b.reason


def test_work_without_gpm_on_a_card_with_unstated_rates_needs_every_pipe_it_has(tmp_path: Path) -> None:
    """An Ada without GPM at 50% GPU-Util: its FP64 and FP16 rates are unstated, so nothing of those
    is asked; its FP32 is taken to be 50% busy (45 TFLOPS), which AdaCheap (30) lacks."""
    cat = catalogue(tmp_path, "Ada", "AdaCheap", "AdaGood")
    a = sizer(cat).advise(gpu(model="Ada", price_per_hour=1.50, memory_total_bytes=48 * GIB, activity_p95=0.5,
                              pipes=None, dram_p95=None, nvlink_bytes_per_second=None))  # fmt: skip
    assert a is not None and a.suggested == "AdaGood"
    assert_mentions(a.reason, "no pipe and DRAM activity", "$0.90/h")


# -- the boundaries of "used" -------------------------------------------------------------------------------
@pytest.mark.parametrize(("fp64", "card"), [(0.01, "Plain"), (0.0099, "NoFp64")])
def test_a_pipe_busy_one_percent_is_used(tmp_path: Path, fp64: float, card: str) -> None:
    """GPM's noise floor is 1%: at 1% the FP64 pipe is used, so a card with no FP64 rate cannot hold
    it; just under, it is not."""
    cat = catalogue(tmp_path, "Big", "Plain", "NoFp64")
    a = sizer(cat).advise(gpu(pipes=IDLE_PIPES | {"tensor": 0.30, "fp64": fp64}))
    assert a is not None and a.suggested == card
    assert ("FP64 1%" in a.reason) is (fp64 >= 0.01)


def test_the_pipes_used_are_listed_in_order_with_their_share(tmp_path: Path) -> None:
    cat = catalogue(tmp_path, "Big", "Plain")
    a = sizer(cat).advise(gpu(activity_p95=0.7, pipes=IDLE_PIPES | {"tensor": 0.40, "fp32": 0.70}))
    assert a is not None and ", pipes tensor 40%, FP32 70% (p95" in a.reason
    idle = sizer(cat).advise(gpu(pipes=IDLE_PIPES))
    assert idle is not None and ", pipes" not in idle.reason and "5% DRAM bandwidth (p95" in idle.reason


@pytest.mark.parametrize(
    ("rate", "said"), [(1e9, "NVLink 1 GB/s each way"), (1.5e9, "NVLink 2 GB/s each way"),
                       (300e9, "NVLink 300 GB/s each way")],
)  # fmt: skip
def test_a_job_moving_a_gb_per_second_over_nvlink_keeps_nvlink(tmp_path: Path, rate: float, said: str) -> None:
    """From 1 GB/s each way NVLink traffic counts: only Link (300 GB/s each way) may hold it, exactly
    the 300 GB/s included, and the advice says both the traffic and the candidate's link."""
    cat = catalogue(tmp_path, "Big", "Link", "Plain", "NoFp64")
    a = sizer(cat).advise(gpu(nvlink_bytes_per_second=rate))
    assert a is not None and a.suggested == "Link"
    assert_mentions(a.reason, said, "Link (NVLink, 300 GB/s each way) holds that")


def test_a_job_moving_less_than_a_gb_per_second_may_leave_nvlink(tmp_path: Path) -> None:
    a = sizer(catalogue(tmp_path, "Big", "Link", "Plain")).advise(gpu(nvlink_bytes_per_second=0.99e9))
    assert a is not None and a.suggested == "Plain" and "NVLink" not in a.reason


@pytest.mark.parametrize(
    ("pipes", "facts"),
    [({"fp64": 0.70}, ("FP64 70%", "no rate for that pipe on an Ada")),
     ({"fp64": 0.01}, ("FP64 1%", "that pipe")),
     ({"fp64": 0.30, "fp16": 0.02}, ("FP64 30%, FP16 2%", "no rate for those pipes on an Ada"))],
)  # fmt: skip
def test_a_gpu_not_sized_for_unrated_pipes_names_each_with_its_share(tmp_path: Path, pipes: dict[str, float],
                                                                    facts: tuple[str, ...]) -> None:  # fmt: skip
    cat = catalogue(tmp_path, "Ada", "AdaGood")
    ada = gpu(model="Ada", price_per_hour=1.50, pipes=IDLE_PIPES | pipes)
    (note,) = sizer(cat).notes(ada)
    assert_mentions(note, "not sized", *facts)
    assert sizer(cat).advise(ada) is None
    # A GPU in MIG mode is not sized at all: no note for its pipes.
    assert sizer(cat).notes(replace(ada, mig_mode=True)) == []
    # Below the noise floor the pipe is not used: sized, no note.
    quiet = replace(ada, pipes=IDLE_PIPES | {p: 0.0099 for p in pipes})
    assert sizer(cat).notes(quiet) == [] and sizer(cat).advise(quiet) is not None


# -- release and reclaim words ---------------------------------------------------------------------------------
def test_a_gpu_without_a_price_or_a_model_is_released_in_words_without_a_figure(tmp_path: Path) -> None:
    idle = gpu(model=None, price_per_hour=None, busy_hours=0.0, idle_hours=720.0, pipes=None)
    a = sizer(catalogue(tmp_path, "Big")).advise(idle)
    assert a is not None and a.kind == RELEASE and a.saving_per_month is None
    assert_mentions(a.reason, "GPU 0 on n1 (model unknown)", "720 h", "(100%); releasing it",
                    "it has no price here, so no figure")  # fmt: skip
    assert a.reason.endswith("releasing it would save what it costs (it has no price here, so no figure)")
    assert "which cost" not in a.reason
