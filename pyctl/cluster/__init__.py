"""How pyctl sees a cluster: the Kubernetes adapter (`kube/`) and, later, the simulated cluster."""
