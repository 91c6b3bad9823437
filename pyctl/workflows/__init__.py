"""Workflows: plans that act on the cluster (compaction, MIG reconfiguration), behind one gate
(dry-run, lease, rate limits) and persisted step by step."""
