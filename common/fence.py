"""The key fence: one record per key across layout changes, whatever a write's delay (ADR-0020).

A layout decides the partition a key's first row is created in. A writer that decided under an earlier
layout may land its insert long after the switch (a paused process, a slow network, a resend), so no clock
can say when the earlier layout is "done". The fence is in storage instead, per key:

* Before the first row of a key is created in its partition ``home`` while earlier layouts are listed, the
  writer inserts a **claim row** at the same RowKey in each earlier layout's partition of the key (insert-
  only), naming ``home`` in ``MovedTo``. A late insert of an earlier layout meets the claim (409), reads it
  and follows it: it never creates a second record. A claim insert that meets a real row finds the key
  already created in an earlier layout: the writer uses that record instead (it never inserts a twin).
* Readers that meet a claim follow ``MovedTo`` (one more point read). Each claim carries ``Era``, the index
  of its writer's layout: a writer that meets a claim of a newer layout than its own (or naming a partition
  it does not know) is behind a change: it forgets its copy of the layout and answers 503
  (``layout-changing``, retry), so it never creates a record of a layout it cannot see.
* An older layout's claim in an earlier partition is replaced by ours (If-Match its ETag), but only once
  every earlier partition is claimed or read and none holds the record.
* A claim where a key is about to be created (a return to an earlier shard count: 1 -> 4 -> 1) names the
  partition an earlier writer aimed for. Written under an older layout, and that partition now fenced by
  the writer's own claim and empty, it is deleted (If-Match its ETag) and the record is inserted in its
  place: a late writer of that partition then meets an insert conflict in the same partition, which
  decides as always. The argument that no interleaving makes two records is in ADR-0020.

Cost: one insert-only entity write (one request) per earlier partition, only when a key is created while an
earlier layout is listed; it takes the place of the probe read the creation made before. Nothing is paid by
a deployment that never changed its layout, nor by any write to an existing record. Claims are kept as long
as the earlier layout is listed (a record of it may still be read or written).

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import LayoutNotReady

# The column that marks a claim row, holding the PartitionKey the key's record is (or will be) created in.
MOVED_TO = "MovedTo"
# The index of the layout the claim's writer routed by (how many layouts came before it): a writer that meets
# a claim of a newer layout than its own is behind, one that meets an older layout's claim at home clears it.
ERA = "Era"
# Attempts of one claim (a claim row deleted between our insert and our read, again and again, is a bug).
_ATTEMPTS = 3


class LayoutBehind(
    LayoutNotReady, slug="layout-changing", title="The shard layout is changing; retry in a moment"
):
    """A claim names a partition this process's copy of the layout does not know: the copy is behind a
    change. The copy is dropped and the call answers 503 with Retry-After (the next one reads it again)."""


def claim_row(pk: str, rk: str, home: str, era: int) -> dict[str, Any]:
    """The claim of RowKey ``rk`` in ``pk``: no record of the key is created there; it lives in ``home``
    (by the layout of index ``era``)."""
    return {"PartitionKey": pk, "RowKey": rk, MOVED_TO: home, ERA: era}


def is_claim(entity: Any) -> bool:
    """Is ``entity`` a claim row (not a record's row)?"""
    return entity is not None and MOVED_TO in entity


def moved_to(entity: Any) -> str:
    return str(entity[MOVED_TO])


def era_of(entity: Any) -> int:
    """The era index of the layout whose writer wrote the claim ``entity``."""
    return int(entity.get(ERA, 0))


@dataclass(frozen=True)
class Fence:
    """What one creation of a key needs to fence it: its partition now (``home``), its partitions in the
    earlier layouts still listed (``earlier``, none equal to ``home``), the index of the layout in force
    (``era``: how many layouts came before it), and how to drop this process's copy of the layout."""

    family: str
    home: str
    earlier: tuple[str, ...]
    era: int
    forget: Callable[[], None]

    @property
    def known(self) -> tuple[str, ...]:
        return (self.home, *self.earlier)

    def behind(self, target: str) -> LayoutBehind:
        """The refusal of a writer whose layout is older than a claim it met (its copy is dropped)."""
        self.forget()
        return LayoutBehind(
            f"The {self.family} shard layout changed: a record of this key belongs in partition {target!r} "
            "by a layout newer than this instance's copy. Retry: the next call reads the layout again.",
            retry_after=1,
        )

    def claim_earlier(self, table: Any, rk: str) -> Any | None:
        """Claim ``rk`` in each earlier partition before the key's first row is created in ``home``.

        Returns the real row found in one of them (the key was created in that earlier layout: use it),
        None when every earlier partition holds a claim of our layout, so that none accepts a creation of
        ``rk`` from now on. A claim written under a newer layout than ours, or naming a partition we do not
        know, raises :class:`LayoutBehind`.

        An older layout's claim names where its writer meant to create the key. It is replaced by ours only
        once every earlier partition is claimed or read and none holds the record: then the partition it
        names refuses that writer, and the claim would only mislead (a reader that follows it, a writer of
        a layout between its and ours whose home it is and who would clear it as older than its own)."""
        older: list[tuple[str, Any]] = []
        for pk in self.earlier:
            found = self._claim(table, pk, rk)
            if found is not None and not is_claim(found):
                return found
            if found is not None:
                older.append((pk, found))
        for pk, found in older:
            for _ in range(_ATTEMPTS):
                if self._replace(table, found):
                    break
                found = self._claim(table, pk, rk)
                if found is None:
                    break
                if not is_claim(found):
                    return found
            else:
                raise LayoutBehind(f"The claim of {rk!r} in {pk!r} kept changing; retry.", retry_after=1)
        return None

    def _claim(self, table: Any, pk: str, rk: str) -> Any | None:
        """Insert our claim at (pk, rk): None when it is ours now; else what stands there (a record, or an
        older layout's claim naming a partition we know). A newer layout's claim raises ``LayoutBehind``."""
        from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

        for _ in range(_ATTEMPTS):
            try:
                table.create_entity(claim_row(pk, rk, self.home, self.era))
                return None
            except ResourceExistsError:
                pass
            try:
                found = table.get_entity(pk, rk)
            except ResourceNotFoundError:
                continue  # deleted between the insert and the read: claim again
            if not is_claim(found):
                return found
            target, era = moved_to(found), era_of(found)
            if era > self.era or (era == self.era and target != self.home) or target not in self.known:
                raise self.behind(target)
            return None if era == self.era else found  # ours (or our layout's: the same claim), or older
        raise LayoutBehind(f"The claim of {rk!r} in {pk!r} kept changing; retry.", retry_after=1)

    def _replace(self, table: Any, found: Any) -> bool:
        """Replace an older layout's claim by ours (If-Match its ETag); False when it changed meanwhile."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
        from azure.data.tables import UpdateMode

        try:
            table.update_entity(
                claim_row(str(found["PartitionKey"]), str(found["RowKey"]), self.home, self.era),
                mode=UpdateMode.REPLACE,
                etag=found.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True

    def clear_home(self, table: Any, found: Any) -> None:
        """A claim ``found`` sits at ``home``, where the key's first row is to be created (a return to an
        earlier shard count). Written under an older layout than ours and naming one of our earlier
        partitions, which :meth:`claim_earlier` fenced and found empty: deleted (If-Match its ETag) so the
        record takes its place. Written under our layout or a newer one: :class:`LayoutBehind`."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        target = moved_to(found)
        if era_of(found) >= self.era or target not in self.earlier:
            raise self.behind(target)
        # Gone or changed: another writer of our layout cleared it (and may have created the record).
        with contextlib.suppress(ResourceNotFoundError, ResourceModifiedError):
            table.delete_entity(
                str(found["PartitionKey"]),
                str(found["RowKey"]),
                etag=found.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
