"""Sources: where readings come from, turned into snapshots.

The backend interface (``backend``), the NVML backend (``nvml``, the only package that knows
pynvml), the simulated backend (``simulated``) and the poller that reads every GPU in parallel and
publishes one immutable :class:`~gpu_exporter.snapshot.NodeSnapshot` per poll, and the schedule
that runs it on the steady clock (``schedule``).

May import: ``snapshot`` and the standard helpers (``settings.durations``, ``logs``).
Never: ``serving``, ``alerting``, ``kubernetes`` or the wiring (``cli``, ``daemon``, ``config``,
``once``).  Sources know nothing of how their snapshots are shown or judged.
"""
