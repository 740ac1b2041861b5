"""The data state machine: idempotent node state on Table Storage."""
