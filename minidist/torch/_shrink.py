"""``torch.distributed.shrink_group`` on the minidist backend.

torch asks the group's backend to ``shrink`` (NCCL's ``ncclCommShrink`` elsewhere) and
then wraps the backend it gets in a new c10d ProcessGroup. The minidist backend *is* a
ProcessGroup (a Python one, which c10d cannot hold as a backend), so torch's step that
wraps it is taught to use it as it is; every other step of torch's shrink_group (the
checks, destroying the old group, making the result the default group, registering it)
is torch's own.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.distributed_c10d as c10d

from .. import elastic_api


def shrink(pg: Any, ranks_to_exclude: list[int], flags: int = 0,
           options: Any = None) -> Any:
    """The backend's ``shrink``: a new minidist group of ``pg``'s members but the
    excluded group ranks (every remaining member calls it; see
    :func:`minidist.shrink_group`), served by a new backend of the same class. The
    session, if ``pg`` owned it, is owned by the new backend from now on (torch destroys
    ``pg`` next)."""
    members = pg.global_ranks
    excluded = [members[int(r)] for r in ranks_to_exclude]
    g = elastic_api.shrink_group(excluded, group=pg.minidist_group)
    new = pg.successor(g)
    _teach_torch()
    return new


_taught: Any = None  # what _teach_torch put in torch's place


def _teach_torch() -> None:
    """Make torch's shrink_group use a minidist backend as the new process group."""
    global _taught
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or original is _taught:
        return

    def create(new_backend: Any, remaining_ranks: list[int], metadata: dict,
               is_default_group: bool) -> Any:
        if not isinstance(new_backend, c10d.ProcessGroup):
            return original(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc("default:shrunken" if is_default_group
                                    else f"{metadata['original_group_name']}:shrunk")
        return new_backend

    _taught = create
    c10d._create_shrunk_process_group = create
