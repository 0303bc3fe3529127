"""share_module: rank 0 trains and publishes, the others run inference on the shared
weights (``basic``), or one rank's model differs (``mismatch``)."""

import sys
import warnings

import torch

import minidist
import minidist.torch as dist

torch.manual_seed(0)
dist.init_process_group("minidist")
rank = dist.get_rank()
mode = sys.argv[1]


class Policy(torch.nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, hidden)
        self.norm = torch.nn.BatchNorm1d(hidden)  # a buffer (running mean, ...)
        self.head = torch.nn.Linear(hidden, 4, dtype=torch.bfloat16)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.body(x))).bfloat16()).float()


if mode == "mismatch":
    try:
        dist.share_module(Policy(32 if rank != 2 else 16))
        raise AssertionError("different models were shared")
    except minidist.CollectiveMismatchError as e:
        assert "models differ" in str(e), e
    print("MISMATCH OK", flush=True)
    dist.destroy_process_group()
    sys.exit(0)

model = Policy()
if rank != 0:  # the workers start from other weights: sharing must replace them
    for p in model.parameters():
        torch.nn.init.normal_(p)
params = list(model.parameters())
x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))  # the same on every rank
shared = dist.share_module(model, src=0)
assert list(model.parameters()) == params  # the same Parameter objects
assert shared.version == 1 or rank == 0
ref = {k: v.clone() for k, v in model.state_dict().items()}
got = [None]
if rank == 0:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model.train()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    v = shared.publish()
    assert v == 2
    model.eval()
    with torch.no_grad():
        want = model(x)
    dist.broadcast_object_list([want], src=0)
else:
    model.eval()
    for n, p in model.named_parameters():
        assert not p.requires_grad, n
    # version 1 is the learner's first weights, in place and read-only
    assert shared.version == 1
    base = model.body.weight
    assert shared.wait(2, timeout=30) == 2
    assert model.body.weight is base  # the same Parameter, its data moved
    want = [None]
    dist.broadcast_object_list(want, src=0)
    with torch.no_grad():
        out = model(x)
    assert torch.equal(out, want[0]), (out, want[0])
    assert model.head.weight.dtype == torch.bfloat16
    view, v = shared.shared.read()
    wptr = model.body.weight.data_ptr()
    assert view.ctypes.data <= wptr < view.ctypes.data + view.nbytes  # no copy: in place
    assert model.norm.running_mean.data_ptr() >= view.ctypes.data
    try:
        model.load_state_dict(ref)
        raise AssertionError("load_state_dict wrote into the shared weights")
    except minidist.DistError as e:
        assert "read-only" in str(e)
    # a compiled forward follows the weights to the next version
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = torch.compile(model, backend="aot_eager")
        with torch.no_grad():
            assert torch.equal(fast(x), want[0])
dist.barrier()
if rank == 0:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    shared.publish()
    with torch.no_grad():
        want = model(x)
    dist.broadcast_object_list([want], src=0)
else:
    shared.wait(3, timeout=30)
    want = [None]
    dist.broadcast_object_list(want, src=0)
    with torch.no_grad():
        assert torch.equal(model(x), want[0])
        assert torch.equal(fast(x), want[0])
dist.barrier()
shared.close()
print("SHARED MODULE OK", flush=True)
dist.destroy_process_group()
