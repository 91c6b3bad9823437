"""The controller: events in, cache and store updated, nodes marked dirty, a work queue that
coalesces bursts, and a level-triggered reconcile that re-scores what changed."""
