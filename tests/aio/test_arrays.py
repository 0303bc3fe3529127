"""The numpy API takes anything that can be viewed as an array without a copy: CPU
torch tensors (DLPack), objects with __array__, and the buffer protocol."""

import asyncio

import pytest

from minidist.ops import ReduceOp
from minidist.plan import as_array

torch = pytest.importorskip("torch")


async def test_torch_cpu_tensors_are_reduced_in_place(job):
    ts = [torch.full((2, 3), float(s.rank + 1)) for s in job]
    await asyncio.gather(*(s.execute(s.plan.prepare_all_reduce(t, ReduceOp.SUM, None, None))
                           for s, t in zip(job, ts)))
    total = sum(range(1, len(job) + 1))
    for t in ts:
        assert torch.equal(t, torch.full((2, 3), float(total)))


async def test_a_non_contiguous_tensor_output_is_written_back(job):
    bases = [torch.zeros(4, 6) for _ in job]
    outs = [b[:, ::2] for b in bases]  # a strided view
    ins = [torch.full((4,), float(s.rank)) for s in job]
    flat_outs = [torch.zeros(4 * len(job)) for _ in job]
    await asyncio.gather(*(s.execute(s.plan.prepare_all_gather(o, i, None, None))
                           for s, o, i in zip(job, flat_outs, ins)))
    for o in flat_outs:
        assert o.tolist() == [float(r) for r in range(len(job)) for _ in range(4)]
    outs[0].copy_(torch.arange(12.0).reshape(4, 3))
    await asyncio.gather(*(s.execute(s.plan.prepare_broadcast(o, 0, None, None))
                           for s, o in zip(job, outs)))
    for b in bases:  # the strided columns got the data, the others were left alone
        assert torch.equal(b[:, ::2], torch.arange(12.0).reshape(4, 3))
        assert not b[:, 1::2].any()


def test_views_share_memory_and_refusals_are_clear():
    t = torch.zeros(5)
    a = as_array(t, "x")
    a[0] = 7
    assert t[0] == 7  # no copy
    buf = bytearray(8)
    v = as_array(memoryview(buf), "x")
    v[1] = 3
    assert buf[1] == 3
    with pytest.raises(TypeError, match="needs a numpy array"):
        as_array([1, 2, 3], "all_reduce")

    class OnDevice:
        def __dlpack_device__(self):
            return (2, 0)  # CUDA

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be called")

    with pytest.raises(TypeError, match="CPU memory"):
        as_array(OnDevice(), "all_reduce")
