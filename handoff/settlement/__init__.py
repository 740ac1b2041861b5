"""Settlement of a parked hand-off: the settler (claim, send, answer), the claim rules, its follow-up, the
timing of confirm and re-send, and the operator's resolution of an unconfirmed claim."""
