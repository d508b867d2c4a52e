"""gpu-exporter: a Prometheus exporter and alerting daemon for NVIDIA GPUs."""

import sys

__version__ = "0.1.0"

# structlog imports rich, where it happens to be installed (a test tool pulls it in), for prettier
# console tracebacks: 52 modules and ~4 MiB resident for the life of the daemon.  Our logs do
# without: structlog is imported here with rich hidden, then rich is importable again for others.
if "structlog" not in sys.modules and "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        if sys.modules.get("rich", 0) is None:
            del sys.modules["rich"]
