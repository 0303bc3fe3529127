"""torch.distributed's ``env://`` rendezvous under ``minidist run``: torch's store is
minidist's own key/value store, so ``init_process_group("minidist")`` (torch's default
``init_method``) runs unchanged and opens no listening port beside the launcher's one.

Outside ``minidist run`` torch's own ``env://`` handler is used as it is (under
torchrun, its TCPStore on MASTER_PORT; minidist listens on MASTER_PORT + 1).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

from .. import api as md
from ..env import default_timeout

# the module (``torch.distributed.rendezvous`` as an attribute is a function)
_rdzv = importlib.import_module("torch.distributed.rendezvous")
_torch_env = _rdzv._rendezvous_handlers["env"]


def _env(url: str, timeout: timedelta = timedelta(minutes=30),
         **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    if "MINIDIST_LAUNCHER" not in os.environ:
        yield from _torch_env(url, timeout=timeout, **kwargs)
        return
    from ._backend import SessionStore

    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    if not md.is_initialized():
        md.init(timeout=default_timeout(os.environ))
    rank = int(query.get("rank", md.get_rank()))
    world_size = int(query.get("world_size", md.get_world_size()))
    if (rank, world_size) != (md.get_rank(), md.get_world_size()):
        raise ValueError(f"env:// under minidist run: rank {rank} of {world_size} does not "
                         f"match the launcher's rank {md.get_rank()} of "
                         f"{md.get_world_size()}")
    store = SessionStore(timeout.total_seconds())
    yield store, rank, world_size
    raise RuntimeError("env:// under minidist run: unable to perform re-rendezvous")


def install() -> None:
    """Put the handler in place (once; torch keeps a table of them by URL scheme)."""
    _rdzv._rendezvous_handlers["env"] = _env
