"""Issue 35: two ``--simulate`` nodes are a fleet.  The simulator derived its UUIDs from the seed and
the index alone, so every simulated node reported the same GPUs: a report over two of them counted
one node's GPUs twice and charged an unpriced node at the other's price.  Now the node's name is in
each UUID, and one node keeps its UUIDs across restarts."""

from __future__ import annotations

import pytest

from gpu_exporter.sources.simulated import SimulatedBackend


def test_two_simulated_nodes_have_distinct_uuids_and_one_node_keeps_its_own() -> None:
    """Two ``--simulate`` nodes are eight GPUs, not four counted twice; a node's simulator restarted
    (a new backend, on the same node) has the same UUIDs as before."""
    nodes = [SimulatedBackend(4, node=node) for node in ("sim-a", "sim-b", "sim-a")]
    uuids = [[x.read_static(i).uuid for i in range(4)] for x in nodes]
    assert len(set(uuids[0]) | set(uuids[1])) == 8 and uuids[2] == uuids[0]


def test_the_simulators_node_is_node_name_else_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the daemon names its node where none is configured: $NODE_NAME, else the hostname."""
    import socket

    monkeypatch.setenv("NODE_NAME", "sim-x")
    assert SimulatedBackend(1).node == "sim-x"
    assert SimulatedBackend(1).read_static(0).uuid == SimulatedBackend(1, node="sim-x").read_static(0).uuid
    monkeypatch.delenv("NODE_NAME")
    monkeypatch.setattr(socket, "gethostname", lambda: "host-y")
    assert SimulatedBackend(1).node == "host-y"
    monkeypatch.setenv("NODE_NAME", "")
    assert SimulatedBackend(1).node == "host-y"


def test_node_name_reaches_the_simulator() -> None:
    """``--node.name`` (node_name) names the simulated node, as it names the daemon's alerts."""
    from gpu_exporter.cli import make_backend
    from gpu_exporter.settings.config import load_settings

    def uuids(node: str) -> list[str]:
        backend = make_backend(load_settings({"simulate": True, "node_name": node}), lambda f, e: None)
        return [backend.read_static(i).uuid for i in range(2)]

    assert uuids("sim-a") == uuids("sim-a") != uuids("sim-b")
