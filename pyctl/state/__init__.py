"""State: where the controller's view of the cluster is kept (Redis, or memory as the embedded
default), behind one interface. Redis commands stop in this package."""
