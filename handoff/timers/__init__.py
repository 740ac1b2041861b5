"""Timer-driven passes over every endpoint: the sweeper (expired hand-offs) and the reconciler (claims not yet
confirmed)."""
