"""minidist: collective communication for many processes per machine.

One listening TCP port per node, Unix domain sockets between the processes of a node,
ring and tree algorithms on numpy arrays. ``import minidist`` needs numpy only.
"""

from typing import TYPE_CHECKING, Any

from .api import GENERATED as _GENERATED  # minidist.scan, ...: from the collective catalog
from .api import (
    Store,
    all_gather,
    all_gather_object,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    broadcast_object,
    destroy,
    gather,
    gather_object,
    get_global_rank,
    get_group_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_process_group_ranks,
    get_rank,
    get_store,
    get_world_size,
    init,
    iprobe,
    irecv,
    irecv_object,
    is_initialized,
    isend,
    isend_object,
    new_group,
    new_subgroups,
    probe,
    recv,
    recv_many,
    recv_object,
    reduce,
    reduce_scatter,
    scatter,
    scatter_object,
    send,
    send_object,
)
from .elastic_api import agree, shrink_group, wait_ranks
from .errors import (
    CollectiveMismatchError,
    DistError,
    DistTimeoutError,
    NotInGroupError,
    PeerLostError,
    ProtocolError,
    RendezvousError,
)
from .group import Group, GroupMember
from .ops import ReduceOp
from .work import Work

if TYPE_CHECKING:  # loaded on first use (below): most ranks never share an array
    from .shared_array import SharedArray

globals().update(_GENERATED)


def __getattr__(name: str) -> Any:
    if name == "SharedArray":
        from .shared_array import SharedArray

        globals()["SharedArray"] = SharedArray
        return SharedArray
    # the version comes from the installed package's metadata, read on first use:
    # importlib.metadata costs every rank a few MiB it would not otherwise need
    if name == "__version__":
        from importlib import metadata

        try:
            return metadata.version("minidist")
        except metadata.PackageNotFoundError:  # a source tree that is not installed
            return "0+unknown"
    raise AttributeError(f"module 'minidist' has no attribute {name!r}")

__all__ = [
    "init", "destroy", "is_initialized", "get_rank", "get_world_size", "get_local_rank",
    "get_local_world_size", "get_node_rank", "new_group", "new_subgroups",
    "get_process_group_ranks", "get_group_rank", "get_global_rank", "all_reduce", "broadcast",
    "barrier", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "all_to_all",
    "send", "recv", "recv_many", "isend", "irecv", "send_object", "recv_object", "isend_object",
    "irecv_object", "probe", "iprobe", "broadcast_object",
    "all_gather_object", "gather_object", "scatter_object", "get_store", "Store", "Group",
    "GroupMember", "ReduceOp", "Work", "shrink_group", "agree", "wait_ranks", "SharedArray",
    "DistError", "DistTimeoutError", "PeerLostError", "CollectiveMismatchError",
    "NotInGroupError", "ProtocolError", "RendezvousError", "__version__",
] + list(_GENERATED)
