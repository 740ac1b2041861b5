"""Hand-off settlement and the NimBus-compatible resolver."""
