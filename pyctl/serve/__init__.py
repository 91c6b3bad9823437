"""The HTTP servers: health, readiness, metrics and the federation view (`health`), and the
kube-scheduler extender (`extender`). They sit above the controller (whose decisions they serve)
and the Kubernetes adapter (whose wire formats they speak)."""
