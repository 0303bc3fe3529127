"""``available()`` on this machine and on made-up ones; CUDA-only calls without CUDA."""

from __future__ import annotations

import pytest

import minidist
import minidist_native
from minidist_native._availability import Facts, judge

from .conftest import has_cuda, torch
from .jobs import python

pytestmark = pytest.mark.timeout(60)

GOOD = dict(torch="2.13.0", cuda="12.8", devices=2, library="/x/libnccl.so.2",
            library_version=(2, 27, 3), library_how="the nvidia-nccl wheel",
            ipc=True)


def test_import_needs_neither_torch_nor_cuda():
    r = python("import sys, minidist_native\n"
               "assert 'torch' not in sys.modules, 'imported torch'\n"
               "print('ok', minidist_native.available.__name__)")
    assert r.returncode == 0 and "ok available" in r.stdout, r.stderr


@pytest.mark.skipif(has_cuda(), reason="this machine has CUDA")
def test_here_it_is_falsy_and_says_why():
    a = minidist_native.available(refresh=True)
    assert not a and a.ok is False
    assert "no CUDA" in a.reason
    assert str(a) == a.reason
    assert a.torch == torch.__version__


@pytest.mark.parametrize("facts,reason", [
    (Facts(), "torch is not installed"),
    (Facts(torch="2.13.0+cpu"), "CPU build"),
    (Facts(torch="2.13.0", cuda="12.8", devices=0, visible=""),
     "no CUDA device is visible (CUDA_VISIBLE_DEVICES='')"),
    (Facts(torch="2.13.0", cuda="12.8", devices=1, search="no libnccl found (looked ...)",
           torch_nccl_why="torch is not compiled with NCCL"),
     "no usable NCCL: no libnccl: no libnccl found"),
    (Facts(torch="2.13.0", cuda="12.8", devices=1, library="/old/libnccl.so.2",
           library_version=(2, 12, 12)),
     "libnccl 2.12.12 at /old/libnccl.so.2 is older than 2.14.0"),
    (Facts(**{**GOOD, "binding": "nvlink"}), "expected 'ctypes' or 'torch'"),
])
def test_each_reason_for_no(facts, reason):
    a = judge(facts)
    assert not a
    assert reason in a.reason


def test_no_nccl_still_serves_cuda_tensors():
    a = judge(Facts(torch="2.13.0", cuda="12.8", devices=1, ipc=True))
    assert not a and a.serves_cuda and a.ipc
    assert not judge(Facts(torch="2.13.0+cpu")).serves_cuda


def test_yes_with_the_ctypes_binding():
    a = judge(Facts(**GOOD))
    assert a and a.binding == "ctypes" and a.nccl == "2.27.3"
    assert "NCCL 2.27.3" in a.reason and "2 CUDA device" in a.reason
    assert a.library == "/x/libnccl.so.2" and a.library_version == "2.27.3"


def test_torch_bindings_are_the_fallback():
    f = Facts(torch="2.13.0", cuda="12.8", devices=1, torch_nccl="2.21.5",
              torch_nccl_ok=True)
    a = judge(f)
    assert a and a.binding == "torch" and a.nccl == "2.21.5" and "torch.cuda.nccl" in a.reason
    # an old libnccl does not stop the fallback
    assert judge(Facts(**{**f.__dict__, "library": "/o", "library_version": (2, 8, 4)})
                 ).binding == "torch"
    # forced
    assert judge(Facts(**{**GOOD, "torch_nccl": "2.27.3", "torch_nccl_ok": True,
                          "binding": "torch"})).binding == "torch"
    bad = judge(Facts(**{**GOOD, "binding": "torch", "torch_nccl_why": "issue 38019"}))
    assert not bad and "issue 38019" in bad.reason


def test_a_version_mismatch_with_torch_is_noted():
    a = judge(Facts(**{**GOOD, "torch_nccl": "2.21.5"}))
    assert any("torch was built with NCCL 2.21.5" in n for n in a.notes)


@pytest.mark.skipif(has_cuda(), reason="this machine has CUDA")
def test_cuda_only_calls_raise_a_clear_dist_error():
    with pytest.raises(minidist.DistError, match="needs CUDA: no CUDA"):
        minidist_native.require("all_reduce")
    for call in (lambda: minidist_native.all_reduce(torch.ones(2)),
                 lambda: minidist_native.broadcast(torch.ones(2), 0),
                 lambda: minidist_native.all_gather(torch.ones(4), torch.ones(2)),
                 lambda: minidist_native.send(torch.ones(2), 1)):
        with pytest.raises(minidist.DistError, match="minidist_native.*needs CUDA"):
            call()


def test_a_cpu_tensor_or_a_non_tensor_is_refused():
    with pytest.raises(TypeError, match="torch.Tensor"):
        minidist_native.all_reduce([1, 2])
    with pytest.raises(minidist.DistError):
        minidist_native.all_reduce(torch.ones(2))
    assert not minidist_native.handles(torch.ones(2))
    assert not minidist_native.handles("cuda")


@pytest.mark.parametrize("error,usable", [
    (RuntimeError("invalid unqiue_id (expected 128 bytes, got 5)"), True),
    (RuntimeError("invalid unique id; expected 128 bytes, found 140737488355333"), False),
    (SystemError("PY_SSIZE_T_CLEAN macro must be defined for '#' formats"), False),
    (TypeError("argument 2 must be bytes"), False),
])
def test_the_torch_bindings_trap_is_told_apart(error, usable):
    from minidist_native._comm import probe_verdict

    ok, why = probe_verdict(error)
    assert ok is usable
    if not usable:
        assert "pytorch issue 38019" in why


def test_this_cpu_torch_has_no_nccl_bindings():
    from minidist_native._comm import torch_nccl_status

    if hasattr(torch._C, "_nccl_init_rank"):
        pytest.skip("this torch has NCCL bindings")
    assert torch_nccl_status() == (False, "torch is not compiled with NCCL "
                                          "(torch.cuda.nccl is missing)")
