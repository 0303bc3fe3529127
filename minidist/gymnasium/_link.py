"""The messages of a vector env over one door: blocking sends and receives of byte rows
(repeated ones run planned once, through the receiver's shared-memory inbox on one
node) and pickled objects for payloads too big for a row."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np

from .. import objects
from ..door import Door
from ..group import Group

# minidist tags of a vector env's messages: the top of the user range, so that a job
# whose ranks also serve envs (minidist.gymnasium.serve) keeps tags 0.. for itself
TAG_ROWS = 2**31 - 16  # command and reply rows
TAG_OBJECTS = TAG_ROWS + 1  # payloads too big for their row
TAG_SETUP = TAG_ROWS + 2  # a serving rank's envs and settings


class Link:
    """Blocking point-to-point calls of one rank on ``door`` (global ranks, the world)."""

    def __init__(self, door: Door) -> None:
        self.door = door

    @property
    def rank(self) -> int:
        return self.door.rank

    def send(self, row: np.ndarray, dst: int, tag: int = TAG_ROWS) -> None:
        d = self.door
        if not d.send_again(row, dst, tag, None):
            d.wait(d.plan.prepare_send(row, dst, tag, None))

    def send_each(self, rows: list[np.ndarray], dsts: list[int]) -> None:
        """:meth:`send` ``rows[i]`` to ``dsts[i]``, in order."""
        self.door.send_each(rows, dsts, TAG_ROWS, None)

    def recv(self, row: np.ndarray, src: int, tag: int = TAG_ROWS) -> None:
        d = self.door
        if not d.recv_again(row, src, tag, None):
            d.wait(d.plan.prepare_recv(row, src, tag, None))

    def recv_many(self, rows: np.ndarray, src: Any = None) -> np.ndarray:
        """Fill ``rows`` with the first ``len(rows)`` rows to arrive; their senders."""
        d = self.door
        m = d.many_again(rows, src, TAG_ROWS, None)
        if m is None:
            m = d.plan_many(rows, src, TAG_ROWS, None)
        return d.wait_many(m)

    def start_many(self, rows: np.ndarray, src: Any = None) -> concurrent.futures.Future:
        """:meth:`recv_many` started on the loop: a future of the senders (for a wait
        with a timeout of its own)."""
        d = self.door
        return d.submit_many(d.plan_many(rows, src, TAG_ROWS, None))

    def scatter(self, output: np.ndarray, input: np.ndarray | None, src: int,
                group: Group) -> None:
        if not self.door.rooted_again("scatter", output, input, src, group):
            self._rooted("scatter", output, input, src, group)

    def gather(self, input: np.ndarray, output: np.ndarray | None, dst: int,
               group: Group) -> None:
        if not self.door.rooted_again("gather", output, input, dst, group):
            self._rooted("gather", output, input, dst, group)

    def _rooted(self, kind: str, output: np.ndarray | None, input: np.ndarray | None,
                root: int, group: Group) -> None:
        """A blocking scatter or gather that does not repeat the last: planned, run and
        remembered (to run again as planned)."""
        d = self.door
        if kind == "scatter":
            item = d.plan.prepare_scatter(output, input, root, group, None)
        else:
            item = d.plan.prepare_gather(input, output, root, group, None)
        d.wait(item)
        d.remember_rooted(item, group, output, input)

    def start_gather(self, input: np.ndarray, output: np.ndarray, dst: int,
                     group: Group) -> concurrent.futures.Future:
        """:meth:`gather` started on the loop (for a wait with a timeout of its own)."""
        d = self.door
        return d.submit(d.plan.prepare_gather(input, output, dst, group, None))

    def new_group(self, ranks: list[int], timeout: float) -> Group:
        """A group of ``ranks`` (made on this rank only: send it to the others)."""
        g = self.door.plan.new_group(ranks, timeout)
        assert isinstance(g, Group)
        return g

    def send_object(self, obj: Any, dst: int, tag: int = TAG_OBJECTS) -> None:
        d = self.door
        d.wait(d.plan.prepare_send(objects.dumps(obj), dst, tag, None, is_object=True))

    def recv_object(self, src: int, tag: int = TAG_OBJECTS) -> Any:
        d = self.door
        return objects.loads(d.wait(d.plan.prepare_recv(None, src, tag, None)))

    def wait_ranks(self, ranks: list[int], timeout: float) -> list[int]:
        """Which of ``ranks`` are alive once all are, or when ``timeout`` runs out."""
        d = self.door
        return d.block(d.wait_ranks(ranks, timeout))
