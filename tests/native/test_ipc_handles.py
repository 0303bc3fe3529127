"""What travels through the store for CUDA IPC is unpickled with an allow-list: torch's
handle rebuilder and the types its arguments hold, nothing else."""

from __future__ import annotations

import os
import pickle

import pytest

from minidist_native._ipc import _segments, grown_capacity, load_handles, slot_capacity

from .conftest import torch

pytestmark = pytest.mark.timeout(30)


def test_torch_handle_tuples_pass():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = (torch.Tensor, torch.Size([4, 2]), (2, 1), 0, torch.UntypedStorage,
            torch.bfloat16, 0, b"\x01" * 64, 4096, 0, False, b"ref", 0, b"\x02" * 64, True)
    blob = pickle.dumps((rebuild_cuda_tensor, args, [[b"e" * 64] * 3] * 2, "GPU-abc"))
    fn, got, events, uuid = load_handles(blob)
    assert fn is rebuild_cuda_tensor and got == args and uuid == "GPU-abc"


@pytest.mark.parametrize("evil", [os.system, eval, pickle.loads, torch.load])
def test_anything_else_is_refused(evil):
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_handles(pickle.dumps((evil, ("echo",))))


def test_slot_sizes_and_segments(monkeypatch):
    assert slot_capacity({}) == 256 << 20
    assert slot_capacity({"MINIDIST_NATIVE_IPC_SLOT_MB": "1"}) == 1 << 20
    assert slot_capacity({"MINIDIST_NATIVE_IPC_SLOT_MB": "0.0001"}) == 4096
    with pytest.raises(ValueError):
        slot_capacity({"MINIDIST_NATIVE_IPC_SLOT_MB": "-1"})
    assert _segments(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert _segments(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_slots_grow_by_powers_of_two_up_to_the_cap():
    assert grown_capacity(4 << 20, 1 << 20, 256 << 20) == 4 << 20  # fits
    assert grown_capacity(4 << 20, (4 << 20) + 1, 256 << 20) == 8 << 20
    assert grown_capacity(4 << 20, 100 << 20, 256 << 20) == 128 << 20
    assert grown_capacity(4 << 20, 1 << 30, 256 << 20) == 256 << 20  # the cap
    assert grown_capacity(256 << 20, 1 << 30, 256 << 20) == 256 << 20
    assert grown_capacity(1 << 20, 1 << 30, 1 << 20) == 1 << 20  # cap below the start
