"""The Kubernetes adapter: Kubernetes JSON stops here; beyond it there are only pyctl's records."""
