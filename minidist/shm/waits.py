"""How a rank of a group's rooted area (:mod:`minidist.shm.rooted_area`) waits for the
others: every wait is bounded, a short spin or yield while the group fits the cores,
then futex sleeps of at most 0.1 s between which the call's deadline, ranks that died
or left and an abort of the group are checked; after 1 s the call is reported to the
rendezvous (the stall check), and from then on the sleeps grow to 1 s (a rank that dies
wakes the sleepers at once)."""

from __future__ import annotations

import os
import time

import numpy as np

from ..group import Group
from .fast_slots import IDLE_SLICE, SLICE, STALL_REPORT, Hooks, Patience, futex_wait

CHECK_EVERY = 0.01  # seconds between a waiter's looks at deadlines and lost ranks


class Waits:
    """The waits of :class:`minidist.shm.rooted_area.Rooted` (whose area words, ``w``,
    headers, ``heads``, and done words, ``dq``, they read)."""

    group: Group
    w: memoryview
    dq: memoryview
    heads: np.ndarray
    base: int
    size: int
    me: int
    patience: Patience

    def _wait_numbers(self, parity: int, number: int, deadline: float, hooks: Hooks,
                      call) -> None:
        """Until every rank stored ``number`` into its header of ``parity`` (the
        receivers of a scatter take their time)."""
        nums = self.numbers[parity]
        self._poll(lambda: [int(r) for r in np.flatnonzero(nums != number)],
                   (deadline, hooks, call))

    def _wait_done(self, lf: int, who, waits: tuple) -> None:
        """Until every rank of ``who`` finished call ``lf`` (rare: a root that scatters
        twice in a row ahead of a slow reader)."""
        self._poll(lambda: [r for r in who if r != self.me and self.dq[r] <= lf], waits)

    def _poll(self, late_ranks, waits: tuple) -> None:
        """Until ``late_ranks()`` (the group ranks still to get there) is empty: yield,
        then sleeps of 20 us growing to 1 ms, between which the call's deadline, lost
        ranks and the group's abort are checked (and the stall reported after 1 s)."""
        deadline, hooks, call = waits
        pause = 20e-6
        start = time.monotonic()
        reported = False
        while True:
            late = late_ranks()
            if not late:
                return
            err = hooks.broken(call)
            if err is None and hooks.anyone_gone():
                for r in late:
                    err = hooks.gone(self.group, self.group.ranks[r])
                    if err is not None:
                        break
            if err is not None:
                raise err
            now = time.monotonic()
            if now >= deadline:
                raise hooks.timed_out(call, [self.group.ranks[r] for r in late])
            if not reported and now - start >= STALL_REPORT:
                reported = True
                hooks.stalled(call)
            os.sched_yield()
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def _wait(self, word: int, want: int, flag: int | None, releaser: int | None,
              parity: int, number: int, deadline: float, hooks: Hooks, call) -> None:
        """Until the int32 ``word`` holds ``want`` (see :meth:`.fast_slots.Slots._wait`):
        ``flag`` the word where a sleeper says so (None: the writer always wakes);
        ``releaser`` the group rank that must store the word (checked for being gone)."""
        words = self.w
        if words[word] == want:
            return
        now = time.monotonic()
        if self.patience.first(lambda: words[word] == want, now, self.size):
            return
        # the call's refusal was looked at as it started: the first look here comes
        # after CHECK_EVERY (a rank lost meanwhile wakes this sleeper at once)
        start, reported, checked, nap = now, False, now, SLICE
        addr = self.base + word * 4
        while True:
            seen = words[word]
            if seen == want:
                return
            now = time.monotonic()
            if now - checked < CHECK_EVERY:  # woken by progress (a count that grew)
                if flag is not None:
                    words[flag] = number
                futex_wait(addr, seen, min(nap, deadline - now))
                continue
            checked = now
            err = hooks.broken(call)
            if err is None and hooks.anyone_gone():
                for other in self._missing(parity, number, releaser):
                    err = hooks.gone(self.group, self.group.ranks[other])
                    if err is not None:
                        break
            if err is not None and words[word] != want:
                raise err
            if now >= deadline:
                raise hooks.timed_out(call, [self.group.ranks[r] for r in
                                             self._missing(parity, number, releaser)])
            if not reported and now - start >= STALL_REPORT:
                reported = True
                hooks.stalled(call)
            elif reported:  # a long wait (workers waiting for their learner): look less
                nap = min(nap * 2, IDLE_SLICE)  # often; a lost peer wakes it at once
            if flag is not None:
                words[flag] = number  # then the kernel's lock, then its look at the word
            futex_wait(addr, seen, min(nap, deadline - now))

    def _missing(self, parity: int, number: int, releaser: int | None) -> list[int]:
        """The group ranks this call still waits for: those whose number is not the
        call's (a root waiting for arrivals), or the releaser."""
        if releaser is not None:
            return [releaser]
        nums = self.heads[:, parity, 0]
        return [int(r) for r in np.flatnonzero(nums != number) if r != self.me]

