"""Serving: what is shown to the world over HTTP.

Metric families and collectors (``metrics``), the exposition writer (``exposition``), the hardened
HTTP server (``http_server``) and its bounded connection table (``connections``), the
exporter-toolkit web config (``web_config``) and the alerts page (``alerts_page``).

May import: ``snapshot``, ``alerting`` (to show alerts), ``accounting`` (to render its books) and
the helpers at the top.
Never: ``sources`` (rendering never calls NVML; a scrape only reads the last snapshot),
``kubernetes``, ``report`` or the wiring.
"""
