"""minidist_native: collectives on CUDA tensors for minidist jobs.

Three paths, chosen per (group, device) on the group's first CUDA call, the same on
every member (see docs/gpu.md):

* **NCCL** when every member has a GPU of its own: the libnccl torch itself loads, bound
  with ctypes (or torch's ``torch.cuda.nccl`` where no libnccl can be opened). The
  unique id travels over minidist's rendezvous; communicators are made lazily, cached,
  and aborted when a peer is lost or a deadline passes, so a dead peer never hangs a
  stream.
* **CUDA IPC** when members share a GPU (NCCL refuses that): buffers and events shared
  through CUDA IPC, reductions on the GPU.
* **host staging** when a group mixes CPU and GPU ranks, or nothing else can serve:
  tensors copied to host memory and moved by minidist's numpy API.

``import minidist_native`` needs neither torch nor CUDA; :func:`available` says whether
NCCL can run here and, when not, why. Calls take minidist groups and global ranks, like
``minidist``'s own, and raise :class:`minidist.DistError` subclasses.
"""

from __future__ import annotations

from ._api import (
    NativeWork,
    all_gather,
    all_reduce,
    broadcast,
    communicators,
    declare_host,
    handles,
    recv,
    reduce,
    reduce_scatter,
    require,
    send,
)
from ._availability import Availability, available
from ._errors import NcclError, NcclUsageError


def shutdown() -> None:
    """Abort this process's communicators and free their buffers (done at exit too)."""
    from ._context import shutdown as _shutdown

    _shutdown()


def _at_exit() -> None:
    from ._context import current

    if current() is not None:
        shutdown()


import atexit as _atexit  # noqa: E402

_atexit.register(_at_exit)

__all__ = [
    "available", "Availability", "require", "handles", "all_reduce", "broadcast", "reduce",
    "all_gather", "reduce_scatter", "send", "recv", "declare_host", "communicators",
    "shutdown", "NativeWork", "NcclError", "NcclUsageError",
]
