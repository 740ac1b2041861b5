"""The side-by-side benchmark (``python -m bench``): Settle against the limits of its storage, as ratios."""
