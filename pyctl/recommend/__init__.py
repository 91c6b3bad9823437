"""Resource normalization (`pyctl recommend`, docs/normalization.md): per GPU model a menu of
standard sizes, the request each workload should make, and node resource classes.

- `sizes`: pools, standard sizes and needs; `menu`: the objective and the search over menus;
- `inventory`: nodes and replicas from records or Kubernetes objects; `prometheus`: GPU usage
  from dcgm-exporter's series; `rightsize`: per-workload recommendations and patches;
- `classes`: resource classes with the MIG planner's layouts; `report`: `recommend`, the whole
  answer; `recommender`: the controller's periodic report; `evaluate`: the replays.

Pure decision code on the core facades (`pyctl.core.fragmentation`, `pyctl.core.mig`), except
`prometheus` (HTTP) and `recommender` (the controller's loop).
"""
