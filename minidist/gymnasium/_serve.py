"""Envs on the ranks of a running job: the vector env's rank sends each serving rank its
envs (:class:`Remote`); :func:`serve` runs them until the vector env is closed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gymnasium.vector.utils import CloudpickleWrapper

from .. import api
from ..errors import DistTimeoutError
from . import _records as rec
from ._link import TAG_SETUP, Link
from ._worker import Worker


class Remote:
    """The workers of a vector env built with ``ranks=``: ranks of this process's job."""

    def __init__(self, ranks: list[int], blocks: list[range], env_fns: list[Callable[[], Any]],
                 layout: rec.Layout, autoreset_mode: Any, spaces: tuple[Any, Any],
                 collective: bool, timeout: float) -> None:
        self.link = Link(api.door())
        me = self.link.rank
        if me in ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks must be distinct ranks other than this one ({me}), "
                             f"not {ranks}")
        self.ranks = ranks
        self.group = self.link.new_group(sorted([me, *ranks]), timeout) if collective else None
        for w, b in enumerate(blocks):
            setup = (me, list(b), [CloudpickleWrapper(env_fns[i]) for i in b], layout,
                     autoreset_mode, spaces, self.group)
            self.link.send_object(setup, ranks[w], tag=TAG_SETUP)

    def death(self, w: int) -> str:
        return f"rank {self.ranks[w]}"

    def kill(self) -> None:
        """Nothing to kill: the ranks belong to the job."""

    def close(self, graceful: bool) -> None:
        """Nothing to close: the ranks go back to what they were doing."""


def serve(src: int | None = None) -> None:
    """Run the envs that a vector env on rank ``src`` (None: any rank) built with
    ``AsyncVectorEnv(env_fns, ranks=[...])`` sends this rank, until it is closed.
    Needs :func:`minidist.init` first. Waits for the vector env without a time limit;
    raises :class:`minidist.PeerLostError` if its rank dies or leaves meanwhile."""
    link = Link(api.door())
    while True:
        try:
            setup = link.recv_object(src, tag=TAG_SETUP)
            break
        except DistTimeoutError:
            continue
    parent, env_ids, env_fns, layout, autoreset_mode, spaces, group = setup
    Worker(link, parent, env_ids, env_fns, layout, autoreset_mode, spaces, group).run(
        parent_may_vanish=False)
