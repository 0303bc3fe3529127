"""Stall reports: the rendezvous compares what ranks waiting in the same call called."""

from __future__ import annotations

from collections import OrderedDict

from .. import messages
from ..errors import AbortKind

STALLS_KEPT = 4096  # stalled calls whose reports the server compares


class Stalls:
    """The reports of the calls that have waited a while, the latest :data:`STALLS_KEPT`."""

    def __init__(self) -> None:
        self._reports: OrderedDict[tuple[int, int], dict[int, messages.Stalled]] = \
            OrderedDict()

    def report(self, rank: int, m: messages.Stalled) -> messages.Abort | None:
        """``rank`` has waited a while in call ``m.seq`` of ``m.group``. If another rank
        waits in the same call having called something else, the call can never
        complete: the abort to send to every rank of the group (else None)."""
        key = (m.group, m.seq)
        reports = self._reports.get(key)
        if reports is None:
            reports = self._reports[key] = {}
            while len(self._reports) > STALLS_KEPT:
                self._reports.popitem(last=False)
        other = next((r for r, o in reports.items() if o.sig != m.sig), None)
        reports[rank] = m
        if other is None:
            return None
        reason = (f"collective mismatch on {m.where} (call #{m.seq}): rank {other} "
                  f"called {reports[other].call} where rank {rank} called {m.call} "
                  f"(found while both waited)")
        return messages.Abort(group=m.group, seq=m.seq, reason=reason,
                              kind=AbortKind.MISMATCH, by=-1)
