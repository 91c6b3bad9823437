"""Offline replays on the product's policy: the FGD trace replay (`trace`) and the seed article's
MIG deployment case (`seed_case`). Not a cluster adapter: nothing here watches or acts."""
