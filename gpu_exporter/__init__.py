"""gpu-exporter: a Prometheus exporter and alerting daemon for NVIDIA GPUs."""

__version__ = "0.1.0"
