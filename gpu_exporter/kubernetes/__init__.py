"""Kubernetes: which pod holds which device.

The kubelet PodResources watcher (``kubelet``), the one gRPC call it makes (``grpc_unix``, HTTP/2
on a unix socket without grpcio), the answer's decoder (``podresources``) and the join of pods and
processes onto snapshot readings (``attribution``).

May import: ``snapshot`` only, within the package.
Never: ``sources``, ``serving``, ``alerting`` or the wiring.  The daemon applies attribution to each
snapshot, so every consumer downstream sees pod labels without knowing the kubelet.
"""
