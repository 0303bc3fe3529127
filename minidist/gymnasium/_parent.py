"""The parent's side of a vector env's messages: commands out, replies in.

Two channels, one row format (:mod:`minidist.gymnasium._records`):

* **collective** (lockstep, the default): one ``scatter`` of every worker's command (a
  single wake-up wakes them all) and one ``gather`` of their reply rows, on a group of
  the parent and its workers;
* **messages** (first-k, ``batch_size < num_envs``): a ``send`` of each addressed
  worker's command, and ``recv_many`` of the first ``k`` rows to arrive.

:class:`Parent` writes command rows and sends them, takes the replies, drops stale
ones (each record carries the number of the command it answers; a record is fresh
while its env still owes an answer to that number), fetches payloads too big for their
row, and starts again a worker whose process died when asked to, then sends it (and,
on the collective channel, everyone: workers answer a command they already answered
with the same reply) the command still owed. It knows nothing of gymnasium's call
order (see :mod:`minidist.gymnasium._vector`).
"""

from __future__ import annotations

import concurrent.futures
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PeerLostError
from ..group import Group
from . import _records as rec
from ._link import TAG_SETUP, Link


class WorkerLostError(PeerLostError):
    """An env's process died (or left) while the vector env needed it.

    ``env_ids`` are the envs that process ran."""

    def __init__(self, message: str, *, env_ids: list[int], ranks: list[int],
                 left: bool = False) -> None:
        super().__init__(message, ranks=ranks, left=left)
        self.env_ids = list(env_ids)


class Pending(TimeoutError):
    """A receive that passed its timeout and goes on (:meth:`Parent.finish` ends it)."""

    def __init__(self, future: concurrent.futures.Future, rows: np.ndarray) -> None:
        super().__init__("timed out")
        self.future, self.rows = future, rows


@dataclass
class Taken:
    """Fresh records (in arrival or env order) and their big payloads by index."""

    records: np.ndarray  # (k, record_size) uint8
    payloads: dict[int, bytes] = field(default_factory=dict)


class Parent:
    """One vector env's messages. ``ranks[w]``: worker ``w``'s global rank; ``blocks[w]``:
    its envs; ``group``: the group of the collective channel (None: messages).
    ``restart(w)``: start worker ``w`` again (None: a death raises); ``death(w)``: how it
    ended, in words."""

    def __init__(self, link: Link, ranks: list[int], blocks: list[range], layout: rec.Layout,
                 group: Group | None, restart: Callable[[int], None] | None,
                 death: Callable[[int], str], timeout: float) -> None:
        self.link, self.ranks, self.blocks, self.layout = link, ranks, blocks, layout
        self.group, self.restart, self.death, self.timeout = group, restart, death, timeout
        self.num_envs = sum(len(b) for b in blocks)
        nw, m = len(blocks), layout.slots
        if group is not None:  # rows in group order, the parent's own among them
            order = list(group.ranks)
            self.row_of = np.array([order.index(r) for r in ranks])
            self.me_row = order.index(link.rank)
            count = len(order)
        else:
            self.row_of, self.me_row, count = np.arange(nw), -1, nw
        self.worker_of = np.concatenate([np.full(len(b), w) for w, b in enumerate(blocks)])
        self.slot_of = np.concatenate([np.arange(len(b)) for b in blocks])
        self.block_start = np.array([b.start for b in blocks])
        self.env_row = self.row_of[self.worker_of]
        self.rank_index = {r: w for w, r in enumerate(ranks)}
        self.commands = np.zeros((count, layout.command_size), np.uint8)
        self.heads = self.commands[:, :rec.COMMAND.size].view(np.int32)  # (rows, 4)
        self.masks = self.commands[:, layout.mask_offset:layout.mask_offset + m]
        self.full_masks = np.zeros((count, m), np.uint8)
        for w, b in enumerate(blocks):
            self.full_masks[self.row_of[w], :len(b)] = 1
        self.command_rows = list(self.commands)
        self.rows = np.zeros((count, layout.reply_size), np.uint8)  # one per worker
        self.mine = np.zeros(layout.command_size, np.uint8)  # the parent's own pieces
        self.mine_reply = np.zeros(layout.reply_size, np.uint8)
        self.mine_reply.reshape(m, -1)[:, 0:4].view(np.int32)[:] = rec.NO_ENV
        self.by_env = np.zeros((self.num_envs, layout.record_size), np.uint8)
        self.seq = 0
        # the number of the command each env owes an answer to (-1: none)
        self.env_seq = np.full(self.num_envs, -1, np.int32)
        self.big: dict[int, bytes] = {}  # worker -> the big payload of its last command
        self.big_sent: set[int] = set()  # workers that have theirs
        self.lost: WorkerLostError | None = None  # a death that ended the vector env
        self._masks_changed = True  # the command rows' masks are not the full ones
        self.group_ranks = None if group is None else np.asarray(group.ranks)
        self._kept: tuple = (None,)  # (rows, their workers' rows): _workers_rows
        self._kept_records: tuple = (None,)  # (rows, as records): _records
        lo = int(self.row_of[0])
        self._dense = (all(len(b) == m for b in blocks)
                       and np.array_equal(self.row_of, np.arange(lo, lo + nw)))
        self.action_views = [self._slot_actions(leaf) for leaf in layout.action_leaves or ()]
        # a private job's gather: the workers' rows (after the parent's own) hold every env
        # in env order
        self._in_order = self._dense and group is not None and self.me_row == 0 \
            and lo == 1

    def _slot_actions(self, leaf: rec.Leaf) -> np.ndarray:
        """Typed view of ``leaf`` of every slot's action: (rows, slots, *shape)."""
        lay = self.layout
        start = lay.actions_offset
        region = self.commands[:, start:start + lay.slots * lay.action_bytes]
        per_slot = region.reshape(len(self.commands), lay.slots, lay.action_bytes)
        return per_slot[:, :, leaf.offset:leaf.offset + leaf.nbytes].view(leaf.dtype).reshape(
            (len(self.commands), lay.slots, *leaf.shape))

    # ------------------------------------------------------------------ commands out

    def put_actions(self, leaf_batches: list[np.ndarray],
                    env_ids: np.ndarray | None = None) -> None:
        """Write flat actions: ``leaf_batches[j]`` holds leaf ``j`` of the actions of the
        envs ``env_ids`` (default: every env, in order)."""
        nw, m = len(self.blocks), self.layout.slots
        for view, batch in zip(self.action_views, leaf_batches, strict=True):
            if env_ids is None and self._dense:
                lo = int(self.row_of[0])
                view[lo:lo + nw] = batch.reshape((nw, m, *view.shape[2:]))
            elif env_ids is None:
                view[self.env_row, self.slot_of] = batch
            else:
                view[self.env_row[env_ids], self.slot_of[env_ids]] = batch

    def addressing(self, env_ids: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The workers of ``env_ids`` (in worker order) and their masks (one row each)."""
        of = self.worker_of[env_ids]
        hit = np.zeros(len(self.blocks), bool)
        hit[of] = True
        workers = np.flatnonzero(hit)
        place = np.empty(len(self.blocks), np.intp)
        place[workers] = np.arange(len(workers))
        masks = np.zeros((len(workers), self.layout.slots), np.uint8)
        masks[place[of], self.slot_of[env_ids]] = 1
        return workers.tolist(), masks

    def send(self, op: int, workers: list[int], payloads: list[Any] | None = None,
             masks: np.ndarray | None = None, split: bool = False,
             all_answer: bool = False) -> int:
        """Send command ``op`` to ``workers`` (every worker on the collective channel):
        payload ``payloads[i]`` (pickled) and mask ``masks[i]`` (default: each of its
        envs) to ``workers[i]``; its number. The envs of the masks answer it (with
        ``all_answer``: every env of those workers)."""
        self.seq = seq = (self.seq + 1) & 0x7FFFFFFF
        flags = rec.SPLIT if split else 0
        lay = self.layout
        everyone = len(workers) == len(self.blocks)
        if everyone and masks is None:
            if self._masks_changed:
                self.masks[...] = self.full_masks
                self._masks_changed = False
            self.env_seq[:] = seq
        if everyone and payloads is None:
            self.heads[:] = (op, 0, flags, seq)
        if self.big:
            self.big.clear()
            self.big_sent.clear()
        if everyone and payloads is None and masks is None:  # a lockstep step
            self._post(workers)
            return seq
        self._masks_changed = True
        if payloads is None and masks is not None and not all_answer:  # first-k steps
            at = np.asarray(workers)
            rows = self.row_of[at]
            self.heads[rows] = (op, 0, flags, seq)
            self.masks[rows] = masks
            which, slots = np.nonzero(masks)  # (masks address only their workers' envs)
            self.env_seq[self.block_start[at[which]] + slots] = seq
            self._post(workers)
            return seq
        for i, w in enumerate(workers):
            row = self.command_rows[self.row_of[w]]
            if payloads is not None:
                data = pickle.dumps(payloads[i], protocol=5)
                n, f = len(data), flags
                if n > rec.COMMAND_PAYLOAD:
                    f |= rec.BIG
                    self.big[w] = data
                else:
                    off = lay.command_payload_offset
                    row[off:off + n] = np.frombuffer(data, np.uint8)
                self.heads[self.row_of[w]] = (op, n, f, seq)
            elif not everyone:
                self.heads[self.row_of[w]] = (op, 0, flags, seq)
            if masks is not None or not everyone:
                b = self.blocks[w]
                mask = self.full_masks[self.row_of[w]] if masks is None else masks[i]
                self.masks[self.row_of[w]] = mask
                if all_answer:
                    self.env_seq[b.start:b.stop] = seq
                else:
                    self.env_seq[b.start:b.stop][mask[:len(b)] > 0] = seq
        self._post(workers)
        return seq

    def _post(self, workers: list[int]) -> None:
        """Send the command rows of ``workers`` (and their big payloads); a death on
        the way is handled by :meth:`_lost`, which sends again what is owed."""
        while True:
            try:
                if self.group is not None:
                    self.link.scatter(self.mine, self.commands, self.link.rank, self.group)
                    if self.big:
                        self._send_big(workers)
                else:
                    rows, row_of, ranks = self.command_rows, self.row_of, self.ranks
                    self.link.send_each([rows[row_of[w]] for w in workers],
                                        [ranks[w] for w in workers])
                    if self.big:
                        self._send_big(workers)
                return
            except PeerLostError as e:
                self._lost(e)
                return  # _lost sent again what is still owed

    def _send_big(self, workers: list[int]) -> None:
        for w in workers:
            if w in self.big and w not in self.big_sent:
                self.link.send_object(self.big[w], self.ranks[w])
                self.big_sent.add(w)

    # ------------------------------------------------------------------ replies in

    def take(self, rows: np.ndarray, want: int, split: bool,
             timeout: float | None = None) -> Taken:
        """Receive until ``want`` fresh records have come (``rows``: what one receive
        fills: a row per worker, or with ``split`` one per env). After ``timeout``
        seconds, :class:`Pending` (the receive goes on)."""
        fresh: list[np.ndarray] = []
        payloads: dict[int, bytes] = {}
        count = 0
        while count < want:
            try:
                got, senders = self._receive(rows, timeout)
            except PeerLostError as e:
                self._lost(e)
                continue
            count = self._sort(got, senders, fresh, payloads, count)
            if count < want and self.group is not None:  # every gather answers one scatter
                raise RuntimeError(f"the vector env's workers answered {count} of {want} "
                                   "envs (a bug of minidist.gymnasium)")
            if count < want:  # stale rows took part of it: keep what came, take the rest
                fresh[-1] = fresh[-1].copy()
                owed = self.env_seq != -1
                left = want - count if split else len(np.unique(self.worker_of[owed]))
                rows = rows[:max(1, min(len(rows), left))]
        recs = np.concatenate(fresh) if len(fresh) > 1 else fresh[0]
        return Taken(recs, payloads)

    def _receive(self, rows: np.ndarray,
                 timeout: float | None) -> tuple[np.ndarray, np.ndarray]:
        """One receive into ``rows``: (the rows to read, the global rank of each)."""
        link = self.link
        if timeout is None:
            if self.group is None:
                return rows, link.recv_many(rows)
            link.gather(self.mine_reply, rows, link.rank, self.group)
            return self._workers_rows(rows)
        if self.group is None:
            future = link.start_many(rows)
        else:
            future = link.start_gather(self.mine_reply, rows, link.rank, self.group)
        try:
            got = future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise Pending(future, rows) from None
        return self._workers_rows(rows) if self.group is not None else (rows, got)

    def _workers_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A gather's rows without the parent's own, when it is the first (a private
        job's), and their ranks."""
        if self.me_row == 0:
            kept = self._kept
            if kept[0] is not rows:  # (the same rows each step: the view made once)
                kept = self._kept = (rows, rows[1:])
            return kept[1], self.group_ranks[1:]
        return rows, self.group_ranks

    def _records(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` as one record per row: (records, record_size)."""
        kept = self._kept_records
        if kept[0] is not rows:
            kept = self._kept_records = (rows, rows.reshape(-1, self.layout.record_size))
        return kept[1]

    def _sort(self, rows: np.ndarray, senders: np.ndarray, fresh: list[np.ndarray],
              payloads: dict[int, bytes], count: int) -> int:
        """Keep the fresh records of ``rows`` (their envs then owe nothing), fetch every
        big payload (fresh or not, in each sender's order); the count of fresh records
        so far."""
        lay = self.layout
        recs = self._records(rows)
        if self._in_order and len(recs) == self.num_envs and \
                not np.count_nonzero(recs[:, 7]):
            # every gather answers the one scatter before it: all fresh, in env order
            self.env_seq[:] = -1
            fresh.append(recs)
            return count + len(recs)
        ids = recs[:, 0:4].view(np.int32)[:, 0]
        valid = ids >= 0
        if valid.all():
            keep = recs[:, 20:24].view(np.int32)[:, 0] == self.env_seq[ids]
        else:
            keep = valid.copy()
            keep[valid] = recs[valid, 20:24].view(np.int32)[:, 0] == self.env_seq[ids[valid]]
        self.env_seq[ids[keep]] = -1
        flags = recs[:, 7]
        if np.count_nonzero(flags):
            rank_of = np.repeat(senders, lay.slots)
            for i in np.flatnonzero(valid & ((flags & rec.F_BIG) > 0)).tolist():
                data = self.link.recv_object(int(rank_of[i]))
                if keep[i]:
                    payloads[count + int(np.count_nonzero(keep[:i]))] = data
        if keep.all():  # (read before the next receive into ``rows``)
            fresh.append(recs)
            return count + len(recs)
        fresh.append(recs[keep])
        return count + int(np.count_nonzero(keep))

    def finish(self, pending: Pending) -> None:
        """Wait for a receive that a timeout left running, and drop what it took."""
        try:
            got = pending.future.result(self.timeout)
        except (PeerLostError, concurrent.futures.TimeoutError):
            return
        rows, senders = (self._workers_rows(pending.rows) if self.group is not None
                         else (pending.rows, got))
        self._sort(rows, senders, [], {}, 0)

    def in_env_order(self, taken: Taken) -> Taken:
        """The records of every env (all answered) in env order."""
        if self._in_order:
            return taken
        ids = taken.records[:, 0:4].view(np.int32)[:, 0]
        self.by_env[ids] = taken.records
        return Taken(self.by_env, {int(ids[i]): p for i, p in taken.payloads.items()})

    # ------------------------------------------------------------------ deaths

    def _lost(self, e: PeerLostError) -> None:
        """Workers died: raise WorkerLostError, or start them again and send what is
        owed again (on the collective channel: a new group first, to everyone)."""
        workers = [self.rank_index[r] for r in e.ranks if r in self.rank_index]
        if not workers:
            raise e
        if self.restart is None:
            self._give_up(workers[0], e)
        for w in workers:
            self.restart(w)
            self.big_sent.discard(w)
        if self.group is not None:
            self.group = self.link.new_group(list(self.group.ranks), self.timeout)
            self.group_ranks = np.asarray(self.group.ranks)
            for r in self.ranks:
                self.link.send_object(self.group, r, tag=TAG_SETUP)
            self._post(list(range(len(self.blocks))))
            return
        for w in workers:
            b = self.blocks[w]
            owed = self.env_seq[b.start:b.stop] != -1
            if owed.any():
                self._masks_changed = True
                self.masks[self.row_of[w], :len(b)] = owed
                self._post([w])

    def _give_up(self, w: int | None, e: PeerLostError) -> None:
        if w is None:
            raise e
        envs = list(self.blocks[w])
        what = f"env {envs[0]}" if len(envs) == 1 else f"envs {envs[0]}-{envs[-1]}"
        self.lost = WorkerLostError(
            f"the process of {what} {'left' if e.left else 'died'} ({self.death(w)}); the "
            "vector env cannot go on: close it (restart_failed=True starts such a process "
            "again)", env_ids=envs, ranks=[self.ranks[w]], left=e.left)
        raise self.lost from e
