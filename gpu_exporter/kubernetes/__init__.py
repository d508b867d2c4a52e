"""Kubernetes: which pod holds which device.

The kubelet PodResources watcher (``kubelet``), the generated gRPC code it speaks
(``podresources``) and the join of pods and processes onto snapshot readings (``attribution``).

May import: ``snapshot`` only, within the package.
Never: ``sources``, ``serving``, ``alerting`` or the wiring.  The daemon applies attribution to each
snapshot, so every consumer downstream sees pod labels without knowing the kubelet.
"""
