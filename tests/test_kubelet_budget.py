"""A kubelet answer is decoded within the refresh deadline and a memory budget (issue 28, point 9).

16 MB of empty pods (``b"\\x0a\\x00" * 8_000_000``, under the 16 MiB cap) took about 85 s to
decode, past the 5 s deadline, and peaked at 2.7 GB against the DaemonSet's 160 Mi limit.  Pods
and fields are now counted as well as bytes, and beyond either the answer is refused and the last
good mapping kept.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.kubernetes.kubelet import PodResourcesWatcher
from gpu_exporter.kubernetes.podresources import MAX_FIELDS, AnswerTooLarge, decode_list_response
from gpu_exporter.snapshot import PodRef
from tests.fake_kubelet import fake_kubelet, pod
from tests.test_grpc_unix import GPU, OK, Reply, framed, h2_server, serving
from tests.timing import LATE_S

FLOOD = b"\x0a\x00" * 8_000_000  # 8 million empty pods in 16 MB


def large_answer(body: bytes) -> Callable[[Reply], None]:
    """A gRPC answer sent in frames as HTTP/2's flow control allows, as a kubelet sends a long one."""

    def respond(r: Reply) -> None:
        r.grpc_headers()
        left = memoryview(body)
        while left:
            size = min(r.conn.local_flow_control_window(r.stream), r.conn.max_outbound_frame_size, len(left))
            if size == 0:
                r.pump()  # wait for the client's window update
                continue
            r.data(bytes(left[:size]))
            left = left[size:]
        r.trailers(OK)

    return respond


@pytest.mark.slow  # 16 MB decoded under tracemalloc: the whole suite runs it, --fast leaves it out
def test_a_flood_of_empty_pods_is_refused_without_memory() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(AnswerTooLarge, match=f"more than {MAX_FIELDS} fields"):
            decode_list_response(FLOOD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak} bytes to refuse it"


def test_the_field_budget_is_exact() -> None:
    three = b"\x0a\x00" * 3
    assert len(decode_list_response(three, max_fields=3)) == 3
    with pytest.raises(AnswerTooLarge):
        decode_list_response(three, max_fields=2)
    # Nested fields count too: one pod with a name is two fields.
    named = b"\x0a\x03\x0a\x01p"
    assert decode_list_response(named, max_fields=2)[0].name == "p"
    with pytest.raises(AnswerTooLarge):
        decode_list_response(named, max_fields=1)


def test_the_field_budget_is_exact_across_many_charges() -> None:
    """Fields are charged 4,096 at a time: the count starts again at 0 after each charge."""
    many = b"\x0a\x00" * 5000
    assert len(decode_list_response(many, max_pods=5000, max_fields=5000)) == 5000
    with pytest.raises(AnswerTooLarge, match=r"^the answer holds more than 4999 fields$"):
        decode_list_response(many, max_pods=5000, max_fields=4999)


def test_the_pod_budget_is_exact() -> None:
    assert len(decode_list_response(b"\x0a\x00" * 5, max_pods=5)) == 5
    with pytest.raises(AnswerTooLarge, match="more than 4 pods"):
        decode_list_response(b"\x0a\x00" * 5, max_pods=4)


def test_decoding_stops_at_the_deadline() -> None:
    """The clock is looked at every 4096 fields: an answer that would outlast the call is refused."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each look: a second later
        return now[0]

    with pytest.raises(AnswerTooLarge, match=r"^the answer could not be decoded before the call's deadline$"):
        decode_list_response(b"\x0a\x00" * 20_000, max_pods=20_000, deadline=2.5, clock=clock)
    assert now[0] == 3.0  # it stopped at the first look past the deadline
    assert len(decode_list_response(b"\x0a\x00" * 20_000, max_pods=20_000, deadline=100.0, clock=clock)) == 20_000
    # At the deadline is not past it.
    assert len(decode_list_response(b"\x0a\x00" * 20_000, max_pods=20_000, deadline=5.0, clock=lambda: 5.0)) == 20_000


def test_the_watcher_refuses_the_flood_and_keeps_the_last_good_pods(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
        path = kubelet.socket_path
        w = PodResourcesWatcher(str(path), timeout=LATE_S)
        assert w.refresh()
    try:
        # More fields than a node holds, in 600 KB (the 16 MB flood is refused the same way, above).
        flood = b"\x0a\x00" * (MAX_FIELDS + 1)
        with capture_logs() as logs, serving(tmp_path, h2_server(large_answer(framed(flood))), path):
            assert not w.refresh()
            assert dict(w.devices()) == {"GPU-a": (PodRef("ns", "p", "main"),)}
        failed = [e for e in logs if e["event"] == "pod_attribution_failed"]
        assert len(failed) == 1 and failed[0]["reason"] == "RESOURCE_EXHAUSTED", failed
        assert "refused: the answer holds more than" in failed[0]["error"]
    finally:
        w.stop()
