"""The blocking calls that keep a job going when ranks die: shrink_group, agree,
wait_ranks (the same names are awaitable in :mod:`minidist.aio`)."""

from __future__ import annotations

from .api import GroupArg, door
from .group import Group


def shrink_group(ranks_to_exclude: list[int] | None = None,
                 group: GroupArg = None) -> Group:
    """A new group of the members of ``group`` (the default group by default) that are
    left once ``ranks_to_exclude`` (global ranks; None: every member known to have died
    or left) are taken out.

    Only the members that stay call it. Every caller gets the same group: the same
    members in the same order (group ranks renumbered 0..n-1, as torch's
    ``shrink_group`` does; global ranks never change), the same new ``epoch`` and an id
    no earlier group had, so that nothing of the old group is mistaken for the new
    one's. A member that dies during the call is left out too (ULFM's
    ``MPIX_Comm_shrink``). Shrinking the default group makes the result the new default
    group for collectives (messages with ``group=None`` still address any rank).
    DistTimeoutError if a member that is neither excluded nor gone never calls it
    within the group's timeout; ValueError for ranks that are not members, named
    twice, or the caller itself.
    """
    d = door()
    return d.block(d.shrink_group(ranks_to_exclude, group))


def agree(flag: bool, group: GroupArg = None) -> bool:
    """A fault-tolerant AND of ``flag`` over the live members of ``group`` (ULFM's
    ``MPIX_Comm_agree``): every member that calls it gets the same answer, also when
    another member dies during the call (its flag then does not count). Every live
    member must call it; DistTimeoutError if one does not within the group's timeout."""
    d = door()
    return d.block(d.agree(flag, group))


def wait_ranks(ranks: list[int], timeout: float | None = None) -> list[int]:
    """The ranks of ``ranks`` that are alive (admitted and not gone), once all of them
    are or once ``timeout`` seconds (default: the job's timeout) have passed; ``0``
    just asks. A rank that died and was started again (``minidist run
    --restart-failed``, or any launcher's restart with the same rank) is alive again
    once the rendezvous admitted its new process; messages to and from it then work as
    before. Make the group that takes it back on one rank and send that group to the
    others (``new_group`` on each would differ if a member died and was started again
    in between: each takes the members' processes it knows of when it calls)."""
    d = door()
    return d.block(d.wait_ranks(ranks, timeout))
