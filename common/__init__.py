"""Pieces both halves of Settle share: settings, Table clients, the HTTP layer, the clock, errors."""
