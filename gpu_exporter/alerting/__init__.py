"""Alerting: judging snapshots and telling people.

Rule settings (``settings``), sliding windows (``window``), the rules (``rules``), the engine that
tracks pending and firing alerts across polls (``engine``), delivery to Alertmanager and
webhooks (``delivery``), and Alertmanager's routing for webhooks fed directly (``routing``).

May import: ``snapshot`` and the helpers in ``settings`` (``durations``, ``redaction``).
Never: ``serving`` (rules know no HTTP page or exposition), ``sources`` (rules judge snapshots,
never NVML), ``kubernetes`` or the wiring.
"""
