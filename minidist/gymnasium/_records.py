"""The bytes a vector env's parent and its workers exchange (pure: numpy and gymnasium's
spaces, no I/O).

Every message is a fixed-size ``uint8`` row, so that a repeated send, receive or
``recv_many`` runs planned once:

* a **command** (parent to worker): a header (op, payload length, flags, number), one
  mask byte per env slot of the worker (which of its envs the command addresses), the
  slots' actions as raw bytes when the action space is flat, then an inline payload
  (pickled: seeds and options, a call's name and arguments, actions of other spaces);
* a **reply** (worker to parent): ``slots`` env records; a record is a header (env id,
  status, terminated, truncated, flags, reward, payload length, number), the
  observation as raw bytes when the observation space is flat, then an inline payload
  (pickled: the info dict, or the observation and info of other spaces, a call's
  result, an error).

A payload larger than its inline room travels as an object message right after its
row (flag ``BIG``). *Flat* spaces are Box, Discrete, MultiDiscrete and MultiBinary,
and Tuple and Dict of them: their values are fixed-size arrays, laid out leaf after
leaf in the order :func:`leaves` gives.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from gymnasium import spaces

# operations
STEP, RESET, CALL, SET_ATTR, CHECK, CLOSE = 1, 2, 3, 4, 5, 6
OPS = {STEP: "step", RESET: "reset", CALL: "call", SET_ATTR: "set_attr",
       CHECK: "check_spaces", CLOSE: "close"}

# command flags
BIG = 1  # the payload follows as an object message
SPLIT = 2  # reply with one row per env, as each env is done (first-k)

# record statuses and flags
OK, ERROR = 0, 1
F_BIG = 1  # the payload follows as an object message
F_OBS = 2  # the payload holds (observation, info): the observation space is not flat
F_RESTARTED = 4  # the env's process was started again: this is a reset's result

COMMAND = struct.Struct("<iiii")  # op, payload length, flags, number
RECORD = struct.Struct("<ib??Bdii")  # env id, status, terminated, truncated, flags,
#                                      reward, payload length, number
RECORD_HEAD = 24
assert RECORD.size == RECORD_HEAD

COMMAND_PAYLOAD = 256  # inline room of a command's payload, bytes
REPLY_PAYLOAD = 256  # inline room of a record's payload, bytes
NO_ENV = -1  # the env id of an unused record slot


def _up8(n: int) -> int:
    return (n + 7) // 8 * 8


FLAT = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def is_flat(space: spaces.Space) -> bool:
    """Whether values of ``space`` are laid out as raw bytes (see the module)."""
    if isinstance(space, FLAT):
        return type(space) in FLAT  # a subclass may hold other values
    if type(space) is spaces.Tuple:
        return all(is_flat(s) for s in space.spaces)
    if type(space) is spaces.Dict:
        return all(is_flat(s) for s in space.spaces.values())
    return False


@dataclass(frozen=True)
class Leaf:
    """One fixed-size array of a flat space's value: where it lies in the row."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @cached_property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _leaf_spaces(space: spaces.Space) -> Iterator[spaces.Space]:
    if type(space) is spaces.Tuple:
        for s in space.spaces:
            yield from _leaf_spaces(s)
    elif type(space) is spaces.Dict:
        for s in space.spaces.values():
            yield from _leaf_spaces(s)
    else:
        yield space


def leaves(space: spaces.Space, offset: int = 0) -> list[Leaf]:
    """The leaves of flat ``space`` laid out from ``offset``, each at an 8-byte boundary."""
    out = []
    for s in _leaf_spaces(space):
        dtype = np.dtype(s.dtype)
        shape = () if isinstance(s, spaces.Discrete) else tuple(s.shape)
        leaf = Leaf(offset, dtype, shape)
        out.append(leaf)
        offset = _up8(offset + leaf.nbytes)
    return out


def values(space: spaces.Space, value: Any) -> Iterator[Any]:
    """The leaf values of a value of flat ``space``, in :func:`leaves` order (for a batch
    made by ``create_empty_array``: its leaf arrays)."""
    if type(space) is spaces.Tuple:
        for s, v in zip(space.spaces, value, strict=True):
            yield from values(s, v)
    elif type(space) is spaces.Dict:
        for k, s in space.spaces.items():
            yield from values(s, value[k])
    else:
        yield value


def extent(ls: list[Leaf], start: int) -> int:
    """Bytes from ``start`` to the end of the last of ``ls`` (8-byte aligned)."""
    return _up8(ls[-1].offset + ls[-1].nbytes) - start if ls else 0


@dataclass(frozen=True)
class Layout:
    """The rows of one vector env: ``slots`` envs per worker, the spaces' layouts."""

    slots: int
    action_leaves: list[Leaf] | None  # None: actions are pickled into the payload
    obs_leaves: list[Leaf] | None  # None: observations are pickled into the payload

    # a command row
    @cached_property
    def mask_offset(self) -> int:
        return COMMAND.size

    @cached_property
    def actions_offset(self) -> int:
        return _up8(COMMAND.size + self.slots)

    @cached_property
    def action_bytes(self) -> int:
        """Bytes of one slot's action (0 when actions are pickled)."""
        if not self.action_leaves:
            return 0
        return extent(self.action_leaves, 0)

    @cached_property
    def command_payload_offset(self) -> int:
        return self.actions_offset + self.slots * self.action_bytes

    @cached_property
    def command_size(self) -> int:
        return self.command_payload_offset + COMMAND_PAYLOAD

    # a reply row: ``slots`` records
    @cached_property
    def obs_bytes(self) -> int:
        if not self.obs_leaves:
            return 0
        return extent(self.obs_leaves, 0)

    @cached_property
    def record_payload_offset(self) -> int:
        return RECORD_HEAD + self.obs_bytes

    @cached_property
    def record_size(self) -> int:
        return self.record_payload_offset + REPLY_PAYLOAD

    @cached_property
    def reply_size(self) -> int:
        return self.slots * self.record_size


def layout(slots: int, action_space: spaces.Space, obs_space: spaces.Space) -> Layout:
    """The layout for workers of ``slots`` envs each with these single-env spaces."""
    if slots < 1:
        raise ValueError(f"a worker needs at least one env, not {slots}")
    return Layout(slots, leaves(action_space) if is_flat(action_space) else None,
                  leaves(obs_space) if is_flat(obs_space) else None)


def blocks(num_envs: int, num_workers: int) -> list[range]:
    """The envs of each worker: contiguous blocks, sizes differing by at most one."""
    if not 1 <= num_workers <= num_envs:
        raise ValueError(f"num_workers must be between 1 and the number of envs "
                         f"({num_envs}), not {num_workers}")
    base, extra = divmod(num_envs, num_workers)
    out, start = [], 0
    for w in range(num_workers):
        size = base + (w < extra)
        out.append(range(start, start + size))
        start += size
    return out


def leaf_view(row: np.ndarray, leaf: Leaf, base: int) -> np.ndarray:
    """A typed view of ``leaf`` in a byte row (``base``: where the value starts)."""
    start = base + leaf.offset
    return row[start:start + leaf.nbytes].view(leaf.dtype).reshape(leaf.shape)


def batch_view(rows: np.ndarray, leaf: Leaf, base: int) -> np.ndarray:
    """``leaf`` of every row of a 2-D byte array, typed: shape (rows, *leaf.shape)."""
    start = base + leaf.offset
    return rows[:, start:start + leaf.nbytes].view(leaf.dtype).reshape(
        (rows.shape[0], *leaf.shape))


def flat_actions(lay: Layout, space: spaces.Space, actions: Any,
                 n: int) -> list[np.ndarray] | None:
    """The leaf batches of ``n`` actions of single-env ``space`` to write as raw bytes;
    None when they travel pickled: the space is not flat, or the actions are of another
    dtype than the space's (they reach the envs as given, as gymnasium passes them).
    ValueError for a batch of another length."""
    if lay.action_leaves is None:
        return None
    if type(space) in FLAT:
        batches = [np.asarray(actions)]
    else:
        batches = [np.asarray(b) for b in values(space, actions)]
    if any(b.dtype != leaf.dtype for b, leaf in zip(batches, lay.action_leaves, strict=True)):
        return None
    for b in batches:
        if len(b) != n:
            raise ValueError(f"{n} actions expected, {len(b)} given")
    return batches
