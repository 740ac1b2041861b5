"""The hand-off's tables: key layout, typed rows, the store's reads and writes, ids, counts and the overview's
reads."""
