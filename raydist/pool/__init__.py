"""The Ray half: placement, rank layout, worker actors and the worker group."""
