"""Serving: what is shown to the world over HTTP.

Metric families and collectors (``metrics``), the exposition writer (``exposition``), the alerts
page (``alerts_page``) and the pages themselves (``pages``: /metrics, the probes, the alerts, a
landing page), which the wiring hands to the web server (``web``) to serve.

May import: ``snapshot``, ``alerting`` (to show alerts), ``accounting`` (to render its books) and
the helpers at the top.
Never: ``sources`` (rendering never calls NVML; a scrape only reads the last snapshot),
``kubernetes``, ``report``, ``web`` (what is shown knows nothing of how it is served) or the wiring.
"""
