"""minidist.torch hands CUDA tensors to minidist_native (checked on a GPU by
benchmarks/gpu_check.py's ddp step). Here, without a GPU: which call goes where, with
what arguments, and that the native call's error reaches ``Work.wait()``; and that the
backend claims the cuda device type only where CUDA exists."""

from __future__ import annotations

import concurrent.futures

import pytest

torch = pytest.importorskip("torch")

import minidist  # noqa: E402
from minidist.torch import _backend  # noqa: E402
from minidist.torch import _collectives as C  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class FakeNative:
    """Records the calls; each returns a NativeWork-like object with a done future."""

    def __init__(self, error=None):
        self.calls = []
        self.error = error

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            f = concurrent.futures.Future()
            if self.error is None:
                f.set_result(None)
            else:
                f.set_exception(self.error)
            return type("NW", (), {"future": f})()
        return call


@pytest.fixture
def native(monkeypatch):
    fake = FakeNative()
    monkeypatch.setattr(C, "_on_gpu", lambda *ts: True)
    monkeypatch.setattr(C, "plain_view", lambda t: None)  # CUDA tensors are never that
    monkeypatch.setattr(C, "_native", lambda: fake)
    monkeypatch.setattr(C, "members", lambda g: (0, 1))
    return fake


def test_each_call_goes_to_its_native_twin(native):
    t = torch.ones(4)
    C.all_reduce(t, "sum", None).wait()
    C.broadcast(t, 1, None).wait()
    C.reduce(t, 0, "max", None).wait()
    C.all_gather_into_tensor(torch.empty(8), t, None).wait()
    C.reduce_scatter_tensor(torch.empty(2), t, "sum", None).wait()
    C.isend(t, 1, 7, None).wait()
    C.irecv(t, 1, 7, None).wait()
    names = [c[0] for c in native.calls]
    assert names == ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                     "send", "recv"]
    assert all(c[2] == {"async_op": True} for c in native.calls)
    assert native.calls[0][1][1] == minidist.ReduceOp.SUM
    assert native.calls[1][1][1] == 1 and native.calls[5][1][1:3] == (1, 7)


def test_list_forms_pack_and_unpack(native):
    outs = [torch.zeros(3), torch.zeros(3)]
    w = C.all_gather(outs, torch.ones(3), None)
    w.wait()
    name, (buf, inp, _g), _ = native.calls[0]
    assert name == "all_gather" and buf.numel() == 6 and inp.numel() == 3
    ins = [torch.full((2,), 1.0), torch.full((2,), 2.0)]
    C.reduce_scatter(torch.empty(2), ins, "sum", None).wait()
    flat = native.calls[1][1][1]
    assert flat.tolist() == [1.0, 1.0, 2.0, 2.0]


def test_the_native_error_reaches_wait(monkeypatch):
    fake = FakeNative(minidist.PeerLostError("rank 1 died"))
    monkeypatch.setattr(C, "_on_gpu", lambda *ts: True)
    monkeypatch.setattr(C, "plain_view", lambda t: None)  # CUDA tensors are never that
    monkeypatch.setattr(C, "_native", lambda: fake)
    w = C.all_reduce(torch.ones(2), "sum", None)
    with pytest.raises(minidist.PeerLostError, match="rank 1 died"):
        w.wait()


def test_calls_without_a_native_twin_refuse_cuda(native):
    with pytest.raises(ValueError, match="CUDA tensors are not supported by this call"):
        C.gather(torch.ones(2), None, 0, None)
    assert native.calls == []


@pytest.mark.skipif(bool(torch.version.cuda), reason="a CUDA build of torch")
def test_a_cpu_build_serves_the_cpu_only():
    pg = _backend.ProcessGroupMinidist.__new__(_backend.ProcessGroupMinidist)
    assert [d.type for d in _backend.ProcessGroupMinidist._device_types.fget(pg)] == ["cpu"]
    with pytest.raises(RuntimeError, match="No backend type associated with device type cuda"):
        _backend.ProcessGroupMinidist._get_backend(pg, "cuda")
