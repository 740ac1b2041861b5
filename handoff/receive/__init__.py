"""Receive of pending hand-offs by agents: the long poll, and the lease rules that fence a settlement."""
