"""The last rank leaves the job; every other rank's next calls through the registered
backend must raise minidist's error, DDP's backward included.

``peer_exit.py MODE`` (``exit``: the script of the last rank returns; ``kill``: it is
killed with SIGKILL) in a torchrun-like environment. Each surviving rank prints
``rank R: OK <check>`` per call that raised as it should, then ``rank R: done``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP

import minidist
import minidist.torch  # noqa: F401  (registers the backend)

#: what a call that needs a departed peer may raise (PeerLostError once the departure
#: is known; DistTimeoutError when the deadline passes first)
GONE = (minidist.PeerLostError, minidist.DistTimeoutError)


def expect_gone(r: int, name: str, call) -> None:
    t0 = time.monotonic()
    try:
        call()
    except GONE as e:
        print(f"rank {r}: OK {name} {type(e).__name__} after {time.monotonic() - t0:.2f} s",
              flush=True)
        return
    except Exception as e:  # the wrong error: say which
        raise AssertionError(f"{name}: raised {type(e).__name__}: {e}") from e
    raise AssertionError(f"{name}: returned normally although a peer has left")


def expect_text(r: int, name: str, call) -> None:
    """torch Futures (and so DDP) carry errors as text: a RuntimeError naming one."""
    try:
        call()
    except RuntimeError as e:
        assert any(c.__name__ in str(e) for c in GONE), f"{name}: {e}"
        print(f"rank {r}: OK {name}", flush=True)
        return
    raise AssertionError(f"{name}: returned normally although a peer has left")


def main() -> None:
    mode = sys.argv[1]
    torch.set_num_threads(1)
    tdist.init_process_group("minidist")
    r, n = tdist.get_rank(), tdist.get_world_size()
    gone = n - 1
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))  # built by every rank (broadcast, shape check)
    tdist.barrier()
    if r == gone:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return  # a normal end of the script

    t = torch.full((4,), float(r))
    expect_gone(r, "all_reduce", lambda: tdist.all_reduce(t))
    expect_gone(r, "broadcast", lambda: tdist.broadcast(t, src=gone))
    expect_gone(r, "recv", lambda: tdist.recv(t, src=gone))
    expect_gone(r, "barrier", lambda: tdist.barrier())
    w = tdist.all_reduce(t, async_op=True)
    expect_gone(r, "async_wait", lambda: w.wait())
    assert w.is_completed() and not w.is_success() and isinstance(w.exception(), GONE)
    fut = tdist.all_reduce(t, async_op=True).get_future()
    expect_text(r, "async_future", fut.wait)

    # DDP: the bucket all_reduce of the backward fails; backward must raise
    loss = model(torch.ones(3, 4)).sum()
    expect_text(r, "ddp_backward", loss.backward)
    tdist.destroy_process_group()
    print(f"rank {r}: done", flush=True)


if __name__ == "__main__":
    main()
