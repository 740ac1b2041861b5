"""The operator's side: the management API (counts, listings, resubmit, skip, poison replay) and its auth."""
