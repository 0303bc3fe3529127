"""torch.distributed on minidist: change ``import torch.distributed as dist`` to
``import minidist.torch as dist``, or keep torch.distributed and use the backend that
importing this module registers: ``torch.distributed.init_process_group("minidist")``.

CPU tensors only; contiguous ones move without copies (numpy views of their memory),
bfloat16 included (raw 16-bit moves, reductions in float32). See docs/torch.md.

This package imports torch; ``import minidist`` never does.
"""

from __future__ import annotations

import torch.distributed

from ..errors import (
    CollectiveMismatchError,
    DistError,
    DistTimeoutError,
    NotInGroupError,
    PeerLostError,
)
from ..group import Group, GroupMember
from ..ops import ReduceOp
from . import _backend, _rendezvous
from ._api import GENERATED as _GENERATED  # scan, ...: from the collective catalog
from ._api import (
    P2POp,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    destroy_process_group,
    gather,
    gather_object,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    isend,
    monitored_barrier,
    new_group,
    new_subgroups,
    recv,
    recv_many,
    recv_object_list,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
    send_object_list,
)
from ._backend import ProcessGroupMinidist
from ._shared import SharedModule, share_module
from ._work import Work

_backend.register()

#: torch.distributed's Backend names (get_backend() returns Backend("minidist"))
Backend = torch.distributed.Backend

globals().update(_GENERATED)

#: torch.distributed's name for a process group; here, any group argument
ProcessGroup = Group

__all__ = [
    "init_process_group", "destroy_process_group", "is_initialized", "is_available",
    "is_gloo_available", "is_nccl_available", "is_mpi_available", "is_torchelastic_launched",
    "get_rank", "get_world_size", "get_backend", "new_group", "new_subgroups",
    "get_process_group_ranks", "get_group_rank", "get_global_rank", "ReduceOp",
    "GroupMember", "Group", "group", "Backend", "ProcessGroup", "ProcessGroupMinidist", "Work",
    "all_reduce",
    "broadcast", "barrier", "monitored_barrier", "reduce", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "gather", "scatter",
    "all_to_all", "all_to_all_single", "send", "recv", "recv_many", "isend", "irecv",
    "batch_isend_irecv",
    "P2POp", "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list", "DistError",
    "DistTimeoutError", "PeerLostError", "CollectiveMismatchError", "NotInGroupError",
    "share_module", "SharedModule",
] + list(_GENERATED)

_rendezvous.install()
