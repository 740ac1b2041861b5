"""Projection of endpoint messages into event rows: the resolver service and its pure rules (the projection
core, the stale-write guard, the status map)."""
