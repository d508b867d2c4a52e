"""Settings: what the user asks for, read from flags, environment and YAML, checked once.

- ``config``: the exporter's settings model (flags, ``GPU_EXPORTER_*`` variables, the YAML file),
  assembled from each part's own settings (alerting, accounting, report); wiring, like ``cli``.
- ``durations``, ``yamlfile``, ``redaction``: parsing helpers with no dependency on the package,
  usable by any part.

Nothing is re-exported here, so a part that needs a helper does not load the whole model (and
with it every part's settings).
"""
