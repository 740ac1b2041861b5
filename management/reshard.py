"""``python -m management.reshard --family state --shards 16`` (``make reshard S=16``): change a recorded
shard layout from a shell, the same audited step as ``POST /api/v1/layout/{family}``; ``--show`` prints the
recorded layouts. Uses the app's storage settings (``SETTLE_TABLES`` ...) from the environment; the change
is recorded as made by ``cli:{user}``."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from common import layouts
from common.errors import SettleError
from management.layout_changes import all_views, change


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make reshard", description=__doc__)
    parser.add_argument("--family", choices=layouts.FAMILIES, default=layouts.STATE)
    parser.add_argument("--shards", type=int, help="the new shard count (1-999)")
    parser.add_argument("--accounts", type=int, default=None, help="state only: storage accounts")
    parser.add_argument("--reason", default=None)
    parser.add_argument("--show", action="store_true", help="print the recorded layouts and change nothing")
    args = parser.parse_args(argv)

    try:
        if args.show or args.shards is None:
            print(all_views().model_dump_json(by_alias=True, indent=2))
            return 0
        changed = change(
            args.family,
            args.shards,
            accounts=args.accounts,
            actor=f"cli:{getpass.getuser()}",
            reason=args.reason,
        )
    except SettleError as exc:
        print(json.dumps(exc.to_problem(), indent=2), file=sys.stderr)
        return 1
    print(changed.model_dump_json(by_alias=True, indent=2))
    at = changed.pending.since.isoformat() if changed.pending is not None else "once written"
    print(
        f"The {args.family} layout becomes {args.shards} shards at {at}; the earlier layout stays read "
        "(docs/tables.md, 'Changing the layout').",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
