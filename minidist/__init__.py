"""minidist: collective communication for many processes per machine.

One listening TCP port per node, Unix domain sockets between the processes of a node,
ring and tree algorithms on numpy arrays. ``import minidist`` needs numpy only.
"""

from .api import (
    Store,
    all_reduce,
    barrier,
    broadcast,
    destroy,
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
    is_initialized,
    new_group,
    new_subgroups,
)
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

__version__ = "0.1.0"

__all__ = [
    "init", "destroy", "is_initialized", "get_rank", "get_world_size", "get_local_rank",
    "get_local_world_size", "get_node_rank", "new_group", "new_subgroups",
    "get_process_group_ranks", "get_group_rank", "get_global_rank", "all_reduce", "broadcast",
    "barrier", "get_store", "Store", "Group", "GroupMember", "ReduceOp", "Work",
    "DistError", "DistTimeoutError", "PeerLostError", "CollectiveMismatchError",
    "NotInGroupError", "ProtocolError", "RendezvousError", "__version__",
]
