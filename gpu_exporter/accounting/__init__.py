"""Accounting: what the GPUs cost and waste, kept by the daemon poll by poll.

Each GPU's time goes to one state per poll: ``busy``, ``allocated_idle``, ``idle`` or ``down``
(``states``), split between the pods or users that hold it (``ledger``).  Alongside: the highest
memory used over a sliding window (``peaks``), the last time a GPU was busy, and the price of each
card from the ``pricing:`` settings (``settings``, ``pricing``).

May import: ``snapshot`` and the helpers in ``settings`` (``durations``, ``redaction``).
Never: ``sources`` (accounting reads snapshots, it knows no NVML), ``serving`` (it knows no HTTP
and no exposition: ``serving`` renders its view), ``alerting`` (the wiring hands it the idle
threshold and signal of GpuUnderutilized), ``kubernetes``, ``report`` or the wiring.
"""
