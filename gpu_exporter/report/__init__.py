"""``gpu-exporter report``: what the GPUs cost and wasted over a range of time, with right-sizing
advice, from any Prometheus-compatible query API (Prometheus, Thanos Query, Mimir,
VictoriaMetrics).

The HTTP client (``client``), the PromQL it asks (``queries``: server-side aggregation only, never
raw samples per GPU), the report's model and its stable JSON (``model``), right-sizing against the
card catalogue (``rightsizing``, ``catalogue.yaml``), the renderers (``render``: table, Markdown,
self-contained HTML with inline SVG charts) and the command line (``command``).

May import: ``accounting`` (the names of the states) and the helpers at the top
(``durations``).
Never: ``snapshot``, ``sources``, ``serving``, ``alerting``, ``kubernetes`` or the wiring.  It runs
on any machine that reaches the query API, far from a GPU.
"""
