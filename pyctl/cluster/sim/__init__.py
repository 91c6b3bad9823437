"""The built-in simulated cluster: GPU/MIG nodes with NUMA zones and a stream of inference
replicas arriving and leaving, placed by a NUMA-aware scheduler, seen through the same records
as a real cluster."""
