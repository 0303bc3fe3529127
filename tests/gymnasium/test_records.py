"""The rows of minidist.gymnasium, byte by byte (pure: no process)."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from gymnasium import spaces  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minidist.gymnasium import _records as rec  # noqa: E402

NESTED = spaces.Dict({"a": spaces.Box(0, 1, (3,), np.float32),
                      "b": spaces.Tuple((spaces.Discrete(5), spaces.MultiBinary(3)))})


@given(st.integers(1, 300), st.integers(1, 300))
def test_blocks_deal_every_env_once_evenly(n, w):
    if w > n:
        with pytest.raises(ValueError):
            rec.blocks(n, w)
        return
    b = rec.blocks(n, w)
    assert [i for r in b for i in r] == list(range(n))
    sizes = [len(r) for r in b]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_leaves_are_aligned_and_in_order():
    ls = rec.leaves(NESTED)
    assert [(leaf.offset, leaf.dtype, leaf.shape) for leaf in ls] == [
        (0, np.dtype(np.float32), (3,)), (16, np.dtype(np.int64), ()),
        (24, np.dtype(np.int8), (3,))]
    assert rec.extent(ls, 0) == 32
    assert rec.is_flat(NESTED) and not rec.is_flat(spaces.Text(5))
    assert not rec.is_flat(spaces.Tuple((spaces.Discrete(2), spaces.Text(3))))


def test_a_value_written_leaf_by_leaf_reads_back():
    lay = rec.layout(2, NESTED, NESTED)
    row = np.zeros(lay.reply_size, np.uint8)
    value = {"a": np.array([0.5, 0.25, 1.0], np.float32), "b": (np.int64(4),
                                                                np.array([1, 0, 1], np.int8))}
    base = lay.record_size + rec.RECORD_HEAD  # the second slot's observation
    for leaf, v in zip(lay.obs_leaves, rec.values(NESTED, value), strict=True):
        rec.leaf_view(row, leaf, base)[...] = v
    rec.RECORD.pack_into(row, lay.record_size, 7, rec.OK, True, False, rec.F_RESTARTED, 1.5,
                         0, 42)
    recs = row.reshape(2, lay.record_size)
    assert rec.RECORD.unpack_from(row, lay.record_size) == (7, 0, True, False, 4, 1.5, 0, 42)
    got = [rec.batch_view(recs, leaf, rec.RECORD_HEAD)[1] for leaf in lay.obs_leaves]
    assert got[0].tolist() == [0.5, 0.25, 1.0] and int(got[1]) == 4
    assert got[2].tolist() == [1, 0, 1]
    assert recs[0].sum() == 0  # nothing spilled into the first slot


def test_command_rows_hold_the_mask_actions_and_payload():
    lay = rec.layout(3, spaces.Box(-1, 1, (2,), np.float64), spaces.Discrete(4))
    assert lay.mask_offset == rec.COMMAND.size
    assert lay.actions_offset == 24 and lay.action_bytes == 16
    assert lay.command_payload_offset == 24 + 3 * 16
    assert lay.command_size == lay.command_payload_offset + rec.COMMAND_PAYLOAD
    assert lay.obs_bytes == 8 and lay.record_size == rec.RECORD_HEAD + 8 + rec.REPLY_PAYLOAD


def test_flat_actions_travel_as_bytes_only_in_the_spaces_dtype():
    space = spaces.Box(-1, 1, (2,), np.float32)
    lay = rec.layout(1, space, space)
    ok = rec.flat_actions(lay, space, np.zeros((4, 2), np.float32), 4)
    assert len(ok) == 1 and ok[0].shape == (4, 2)
    assert rec.flat_actions(lay, space, np.zeros((4, 2), np.float64), 4) is None
    with pytest.raises(ValueError, match="4 actions expected, 3 given"):
        rec.flat_actions(lay, space, np.zeros((3, 2), np.float32), 4)
    words = spaces.Text(4)
    assert rec.flat_actions(rec.layout(1, words, space), words, ["a"] * 4, 4) is None
