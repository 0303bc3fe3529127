"""Aborts and stall reports: a failed call breaks its group and tells the other
ranks; their aborts, a mismatched frame or an unexpected one end this rank's call;
timeouts name the ranks that never arrived."""

from __future__ import annotations

from .. import messages, wire
from ..errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError, again
from ..plan import Call
from .base import (
    FINISHED_KEPT,
    log,
)


class Aborts:
    """Aborts and stall reports: a failed call breaks its group and tells the other"""

    def abort_received(self, abort: messages.Abort) -> None:
        """Another rank's call ``(group, seq)`` failed: the same call fails here, and the
        group is unusable from now on (every later call on it raises at once)."""
        gid, seq = abort.group, abort.seq
        exc = abort.error()
        log.info("rank %s aborted call #%d of group %#x: %s", abort.by, seq, gid,
                 abort.reason)
        self.broken.setdefault(gid, exc)
        for a in list(self._active):
            if a.call is not None and a.call.group.id == gid:
                a.quiet = True
                self._fail(a, exc)
        if (gid, seq) not in self._finished:
            self._aborted[(gid, seq)] = exc
            while len(self._aborted) > FINISHED_KEPT:
                self._aborted.popitem(last=False)

    def _frame_mismatch(self, group: int, seq: int, err: Exception) -> None:
        """A frame of a running collective, not yet asked for, does not fit the call."""
        for a in list(self._active):
            if a.call is not None and (a.call.group.id, a.call.seq) == (group, seq):
                self._fail(a, err)

    def _unexpected(self, h: wire.Header) -> bool:
        """A collective's frame arrived that no running call expects. If its call is
        over here, drop it; had that call succeeded, the ranks disagreed on it (roots,
        algorithms, sizes), and the group is broken on every rank."""
        key = (h.group, h.seq)
        if key not in self._finished:
            return False  # its call has not started yet
        call = self._finished[key]
        if call is not None and call.group.id not in self.broken:
            err = self._checker(call, -1)(h) or CollectiveMismatchError(
                f"collective mismatch on {call.group!r} (call #{call.seq}): rank {h.src} "
                f"sent data for {call.describe(h)} that rank {self.rank} did not need for "
                f"its {call.describe()}")
            self._break(call, err, tell=True)
        return True

    def _break(self, call: Call, exc: DistError, tell: bool) -> None:
        """A call on this rank failed: its group is unusable from now on; the first time,
        with ``tell``, the other ranks of the group hear of it."""
        gid = call.group.id
        if gid in self.broken:
            return
        self.broken[gid] = exc
        if tell:
            self._broadcast_abort(call, exc)

    def fast_failed(self, call: Call, exc: DistError) -> None:
        """A fast call (run on another thread) failed on this rank: as for any call, its
        group is unusable and the other ranks hear of it."""
        self._done((call.group.id, call.seq), None)
        self._break(call, exc, tell=True)

    def may_refuse(self) -> bool:
        """False when :meth:`refusal` would refuse no call at all (nothing failed,
        aborted or died, the rendezvous is there): a cheap look before a fast call."""
        return self.rendezvous_lost is not None or bool(
            self._aborted or self.broken or self.lost or self.died)

    def refusal(self, call: Call, consume: bool = True) -> DistError | None:
        """Why a collective cannot even start (or go on), or None. Without ``consume``
        nothing is changed (safe to call from another thread)."""
        g = call.group
        if self.rendezvous_lost is not None:
            return self.no_rendezvous(call.name)
        aborted = (self._aborted.pop if consume else self._aborted.get)((g.id, call.seq), None)
        if aborted is not None:
            return aborted
        broken = self.broken.get(g.id)
        if broken is not None:
            return again(broken, f"{call.name} on {g!r} (call #{call.seq}) refused on rank "
                          f"{self.rank}: the group is unusable since a call on it failed")
        if self.lost:
            lost = g.members_among(self.lost)
            if lost:
                return PeerLostError(
                    f"{call.name} on {g!r}: rank(s) {lost} died earlier "
                    f"({self.lost[lost[0]]})", ranks=lost, collective=call.name, group=g)
        if self.died:
            stale = self.stale(g)
            if stale:
                return PeerLostError(
                    f"{call.name} on {g!r}: rank(s) {stale} died earlier "
                    f"({self.died[stale[0]]}); the group was made with the process that "
                    "died (make a new group with the restarted rank)", ranks=stale,
                    collective=call.name, group=g)
        return None

    def report_stall(self, call: Call) -> None:
        """This call has waited a while: tell the rendezvous what it is, so that it can
        compare it with what the other waiting ranks called under the same number."""
        if self.rendezvous_lost is not None:
            return
        sig = [call.kind, call.dtype, call.op, call.algorithm, call.root, call.count,
               call.shape]
        try:
            self.client.notify(messages.Stalled(
                group=call.group.id, seq=call.seq, sig=sig, call=call.describe(),
                where=repr(call.group), ranks=list(call.group.ranks)))
        except Exception as e:
            log.debug("could not report a stalled call: %s", e)

    def _broadcast_abort(self, call: Call, exc: DistError) -> None:
        if self.client is None or self.rendezvous_lost is not None:
            return
        if isinstance(exc, PeerLostError) and not exc.left and exc.ranks and \
                all(r in self.lost for r in exc.ranks):
            # the rendezvous told every rank of these deaths itself, and every call on a
            # group with a dead member fails on its own: n survivors telling n - 1 others
            # would be n^2 messages through the rendezvous just when it is needed most
            return
        abort = messages.Abort.of_error(exc, call.group.id, call.seq, list(call.group.ranks))
        try:
            self.client.notify(abort)
        except Exception as e:  # the job is already failing; the local error still raises
            log.debug("could not broadcast abort: %s", e)

    async def timeout_error(self, call: Call, timeout: float,
                             waiting: set[int]) -> DistTimeoutError:
        name = call.name
        missing: list[int] = []
        if self.client is not None and self.rendezvous_lost is None:
            try:
                reply = await self.client.request(
                    messages.Progress(group=call.group.id, ranks=list(call.group.ranks)),
                    timeout=5.0)
                entered = reply.entered or {}
                missing = sorted(r for r in call.group.ranks if r != self.rank and (
                    str(r) not in entered or entered[str(r)] is None
                    or entered[str(r)] <= call.seq))
            except Exception as e:
                log.debug("progress query failed: %s", e)
        detail = (f"ranks that never arrived: {missing}" if missing else
                  f"every rank arrived; still waiting on data from ranks {sorted(waiting)}")
        return DistTimeoutError(
            f"{name} on {call.group!r} (call #{call.seq}) timed out after {timeout:g} s on "
            f"rank {self.rank}; {detail}", collective=name, group=call.group,
            missing=missing or sorted(waiting))

