"""Holders outside Kubernetes: which Slurm job and which container runs each GPU process.

A process's ``/proc/<pid>/cgroup`` names the Slurm job or the container it runs in (``cgroups``);
dcgm-exporter's job mapping files say which jobs each GPU is allocated to (``slurm``); the Docker
and Podman API sockets name containers (``engines``).  ``attribution`` joins them onto the
readings of a poll, off the scrape path, as ``kubernetes`` joins pods.

May import: ``snapshot`` and the helper for text from outside (``untrusted``), within the package.
Never: ``sources``, ``serving``, ``alerting``, ``accounting``, ``kubernetes``, ``report`` or the
wiring.  The daemon and ``--once`` apply attribution to each snapshot, so every consumer
downstream sees jobs and containers without knowing where they came from.
"""
