"""The exceptions minidist raises. Every one is a :class:`DistError`."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class DistError(RuntimeError):
    """Base class of every error minidist raises for a distributed failure."""


class DistTimeoutError(DistError, TimeoutError):
    """A collective or wait did not finish before its deadline.

    ``missing`` holds the global ranks that never arrived (empty if unknown).
    """

    def __init__(self, message: str, *, collective: str = "", group: object = None,
                 missing: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.collective = collective
        self.group = group
        self.missing = tuple(sorted(missing))


class PeerLostError(DistError, ConnectionError):
    """A peer process died, or left the job, while this rank needed it.

    ``ranks`` holds the global ranks that were lost (empty when the rendezvous itself
    was lost and nobody can say which). ``left`` is True when they left normally (their
    script returned or called ``destroy()``), False when one of them died (crashed,
    was killed, or its node vanished).
    """

    def __init__(self, message: str, *, ranks: Iterable[int] = (), collective: str = "",
                 group: object = None, left: bool = False) -> None:
        super().__init__(message)
        self.ranks = tuple(sorted(ranks))
        self.collective = collective
        self.group = group
        self.left = left


class CollectiveMismatchError(DistError, ValueError):
    """Ranks called different collectives, shapes, dtypes, ops or roots.

    Raised from the frame headers before the caller's arrays are modified.
    """


class ProtocolError(DistError):
    """Bytes on a socket did not follow the minidist wire format."""


class RendezvousError(DistError):
    """The rendezvous refused this process or could not be reached."""


class NotInGroupError(DistError, ValueError):
    """A rank called a collective on a group it is not a member of."""


def again(exc: BaseException, prefix: str) -> DistError:
    """An error of the same kind as ``exc`` (a DistError for anything else), for a later
    call refused because of it: ``prefix: exc``."""
    msg = f"{prefix}: {exc}"
    if isinstance(exc, PeerLostError):
        return PeerLostError(msg, ranks=exc.ranks, collective=exc.collective,
                             group=exc.group, left=exc.left)
    if isinstance(exc, DistTimeoutError):
        return DistTimeoutError(msg, collective=exc.collective, group=exc.group,
                                missing=exc.missing)
    if isinstance(exc, DistError):
        return type(exc)(msg)
    return DistError(f"{prefix}: {type(exc).__name__}: {exc}")


class AbortKind(enum.StrEnum):
    """Why another rank aborted a call, as its abort message says: the one mapping
    between the kinds that travel and the errors they raise (:attr:`error_class`)."""

    MISMATCH = "mismatch"
    LOST = "lost"
    TIMEOUT = "timeout"

    @classmethod
    def of(cls, exc: BaseException) -> AbortKind:
        """The kind an abort for ``exc`` travels as (MISMATCH for any other error)."""
        for kind, error in _ABORT_ERRORS.items():
            if kind is not cls.MISMATCH and isinstance(exc, error):
                return kind
        return cls.MISMATCH

    @classmethod
    def parse(cls, value: object) -> AbortKind:
        """The kind a message names; MISMATCH for a kind this version does not know
        (an abort still ends the call, as a mismatch)."""
        try:
            return cls(value)
        except ValueError:
            return cls.MISMATCH

    @property
    def error_class(self) -> type[DistError]:
        """The error an abort of this kind raises on the ranks that hear of it."""
        return _ABORT_ERRORS[self]


_ABORT_ERRORS: dict[AbortKind, type[DistError]] = {
    AbortKind.MISMATCH: CollectiveMismatchError,
    AbortKind.LOST: PeerLostError,
    AbortKind.TIMEOUT: DistTimeoutError,
}
