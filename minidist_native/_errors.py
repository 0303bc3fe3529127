"""NCCL result codes as minidist errors (pure: no torch, no ctypes).

Every error minidist_native raises is a :class:`minidist.DistError`. A failed NCCL call
becomes the minidist error a user of the CPU path would get for the same trouble:

=====================  ==  ==========================================================
NCCL result            #   raised as
=====================  ==  ==========================================================
ncclSuccess            0   (nothing)
ncclUnhandledCudaError 1   :class:`NcclError` (a CUDA call inside NCCL failed)
ncclSystemError        2   :class:`NcclError` (a system call or socket failed)
ncclInternalError      3   :class:`NcclError`
ncclInvalidArgument    4   :class:`NcclUsageError` (also a ValueError)
ncclInvalidUsage       5   :class:`NcclUsageError` (also a ValueError)
ncclRemoteError        6   :class:`minidist.PeerLostError` (a peer exited or its link broke)
ncclInProgress         7   (not an error: a nonblocking call still running)
ncclTimeout            8   :class:`minidist.DistTimeoutError`
anything else              :class:`NcclError`
=====================  ==  ==========================================================
"""

from __future__ import annotations

from collections.abc import Iterable

from minidist.errors import DistError, DistTimeoutError, PeerLostError

SUCCESS = 0
UNHANDLED_CUDA_ERROR = 1
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8

RESULT_NAMES = {
    SUCCESS: "ncclSuccess",
    UNHANDLED_CUDA_ERROR: "ncclUnhandledCudaError",
    SYSTEM_ERROR: "ncclSystemError",
    INTERNAL_ERROR: "ncclInternalError",
    INVALID_ARGUMENT: "ncclInvalidArgument",
    INVALID_USAGE: "ncclInvalidUsage",
    REMOTE_ERROR: "ncclRemoteError",
    IN_PROGRESS: "ncclInProgress",
    TIMEOUT: "ncclTimeout",
}

# what each code means, for when the library's own string is not at hand
_MEANING = {
    UNHANDLED_CUDA_ERROR: "a CUDA call inside NCCL failed",
    SYSTEM_ERROR: "a system call or socket failed inside NCCL (often: a peer process died)",
    INTERNAL_ERROR: "NCCL hit an internal error",
    INVALID_ARGUMENT: "NCCL was given an invalid argument",
    INVALID_USAGE: "NCCL was used the wrong way",
    REMOTE_ERROR: "a remote process exited or there was a network error",
    IN_PROGRESS: "the NCCL operation is still in progress",
    TIMEOUT: "NCCL timed out",
}

PREFIX = "[minidist_native] "


class NcclError(DistError):
    """An NCCL call failed. ``code`` is NCCL's result code, ``result`` its name
    (``"ncclSystemError"``), ``call`` the NCCL function, ``last_error`` NCCL's own last
    error text (may be empty)."""

    def __init__(self, message: str, *, code: int = -1, call: str = "",
                 last_error: str = "", collective: str = "", group: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.result = result_name(code)
        self.call = call
        self.last_error = last_error
        self.collective = collective
        self.group = group


class NcclUsageError(NcclError, ValueError):
    """NCCL refused the arguments (ncclInvalidArgument / ncclInvalidUsage)."""


def result_name(code: int) -> str:
    """NCCL's name for a result code (``"ncclResult(42)"`` for one it does not know)."""
    return RESULT_NAMES.get(code, f"ncclResult({code})")


def describe(code: int, text: str = "") -> str:
    """``"ncclRemoteError (6): <text>"`` with the library's string when given."""
    return f"{result_name(code)} ({code}): {text or _MEANING.get(code, 'unknown NCCL result')}"


def nccl_error(code: int, *, call: str, text: str = "", last_error: str = "",
               collective: str = "", group: object = None,
               peers: Iterable[int] = ()) -> DistError | None:
    """The minidist error for NCCL result ``code`` of ``call`` (None for success and for
    ncclInProgress). ``text`` is ncclGetErrorString's, ``last_error`` ncclGetLastError's;
    ``peers`` the global ranks the communicator talks to (named by a PeerLostError)."""
    if code in (SUCCESS, IN_PROGRESS):
        return None
    what = collective or call
    where = f" on {group!r}" if group is not None else ""
    message = f"{PREFIX}NCCL {what}{where} failed: {describe(code, text)}"
    if last_error:
        message += f"; NCCL's last error: {last_error.strip()}"
    if code == REMOTE_ERROR:
        peers = tuple(peers)
        return PeerLostError(message + (f" (the communicator's peers: global ranks "
                                        f"{list(peers)})" if peers else ""),
                             ranks=(), collective=what, group=group, left=False)
    if code == TIMEOUT:
        return DistTimeoutError(message, collective=what, group=group)
    cls = NcclUsageError if code in (INVALID_ARGUMENT, INVALID_USAGE) else NcclError
    return cls(message, code=code, call=call, last_error=last_error, collective=what,
               group=group)


def unusable(error: BaseException, what: str) -> DistError:
    """The error every later call on a communicator that failed raises: the same class
    (and attributes) as ``error``, with the message minidist uses for a broken group."""
    import copy

    message = (f"{PREFIX}{what}: the group is unusable since a call on it failed: "
               f"{error}")
    if isinstance(error, DistError):
        again = copy.copy(error)
        again.args = (message,)
        return again
    return DistError(message)
