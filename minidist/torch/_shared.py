"""A model whose weights one rank publishes and every other rank reads in place.

``share_module(model, src=0, group=None)`` (every member of the group, each with a
model of the same layout) puts the model's parameters and buffers into one
:class:`minidist.SharedArray`: on ``src`` (the learner) :meth:`SharedModule.publish`
copies them in once per version; on every other rank (a worker) the model's
parameters and buffers *are* views of the latest version it took (``refresh()``), so
an inference step reads the learner's weights with no copy and no memory of its own.

On a worker:

* parameters are replaced in place (``param.data`` points into the shared version; the
  Parameter objects stay, so optimizers, hooks and ``named_parameters`` see the same
  objects) and no longer require grad; buffers are replaced in their modules;
* the shared pages are mapped read-only: an in-place write (``param.add_``, an
  optimizer step, ``load_state_dict``) cannot change what the others read.
  ``load_state_dict`` raises a clear DistError; other in-place writes touch read-only
  memory, which kills the process (SIGSEGV) - load and train on ``src`` only;
* run inference under ``torch.no_grad()`` / ``torch.inference_mode()`` (the weights
  need no grad anyway; a forward outside them still builds a graph for the inputs);
* ``refresh()`` between inference steps, never during one: it re-points the tensors
  at the new version and the one they pointed at may then be rewritten;
* ``torch.compile``: the Parameter objects stay the same and only their data moves,
  which compiled code reads at each call (see docs/weights.md for what was tried).
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np
import torch

from .. import api
from ..errors import CollectiveMismatchError, DistError
from ..shared_array import DEFAULT_BUFFERS, SharedArray

ALIGN = 64  # every tensor starts on a cache line of the shared version


class _Entry:
    __slots__ = ("name", "owner", "attr", "is_param", "shape", "dtype", "offset", "nbytes",
                 "tensor")

    def __init__(self, name: str, owner: torch.nn.Module, attr: str, is_param: bool,
                 tensor: torch.Tensor, offset: int) -> None:
        self.name, self.owner, self.attr, self.is_param = name, owner, attr, is_param
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        self.offset, self.nbytes = offset, tensor.numel() * tensor.element_size()
        self.tensor = tensor


def _entries(model: torch.nn.Module) -> tuple[list[_Entry], int]:
    """Every parameter and buffer of ``model`` (once each), with its place in the
    shared version, and the version's size in bytes."""
    out, at = [], 0
    named = [(n, p, True) for n, p in model.named_parameters()]
    named += [(n, b, False) for n, b in model.named_buffers()]
    for name, t, is_param in named:
        if t.device.type != "cpu":
            raise DistError(f"share_module: {name} is on {t.device}; CPU tensors only")
        prefix, _, attr = name.rpartition(".")
        owner = model.get_submodule(prefix) if prefix else model
        out.append(_Entry(name, owner, attr, is_param, t, at))
        at += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
    return out, at


def _digest(entries: list[_Entry]) -> str:
    text = ";".join(f"{e.name}:{e.shape}:{e.dtype}:{int(e.is_param)}" for e in entries)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


class SharedModule:
    """What :func:`share_module` returns: ``model`` (the same module object),
    ``publish()`` on ``src``, ``refresh()`` / ``wait()`` on the workers, ``version``
    (the version the model's weights show now), ``close()``."""

    def __init__(self, model: torch.nn.Module, src: int, group: Any, name: str,
                 buffers: int) -> None:
        entries, total = _entries(model)
        digest = _digest(entries)
        try:
            self.shared = SharedArray(f"{name}#{digest}", (total,), np.uint8, src, group,
                                      buffers=buffers)
        except CollectiveMismatchError as e:
            raise CollectiveMismatchError(
                f"share_module: the models differ between ranks (the names, shapes or dtypes "
                f"of their parameters and buffers; digests follow the '#'): {e}") from None
        self.model, self.src, self._entries = model, src, entries
        self.is_src = api.door().rank == src
        self._tensors: dict[int, list[torch.Tensor]] = {}  # id(version's view) -> tensors
        self.version = 0
        if not self.is_src:
            self._hook = model.register_load_state_dict_pre_hook(self._refuse_load)
            for e in entries:
                if e.is_param:
                    e.tensor.requires_grad_(False)

    # ------------------------------------------------------------------ the learner

    def publish(self) -> int:
        """Copy the model's parameters and buffers into a new version (only on
        ``src``); its number."""
        if not self.is_src:
            raise DistError(f"share_module: only src (rank {self.src}) publishes")
        entries = self._entries

        def fill(buf: np.ndarray) -> None:
            whole = torch.from_numpy(buf)
            with torch.no_grad():
                for e in entries:
                    live = getattr(e.owner, e.attr)
                    if tuple(live.shape) != e.shape or live.dtype != e.dtype:
                        raise DistError(f"share_module: {e.name} is now {tuple(live.shape)} "
                                        f"{live.dtype}, was {e.shape} {e.dtype}")
                    dst = whole[e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape)
                    dst.copy_(live.detach())

        self.version = self.shared.publish_with(fill)
        return self.version

    # ------------------------------------------------------------------ the workers

    def refresh(self) -> int:
        """Point the model's parameters and buffers at the latest version (nothing to do
        if it is the one they show); that version's number. On ``src``: the latest
        published version, the model untouched."""
        if self.is_src:
            return self.shared.latest
        view, v = self.shared.read()
        if v == self.version and self._tensors:
            return v
        tensors = self._tensors.get(id(view))
        if tensors is None:
            tensors = self._tensors[id(view)] = self._views(view)
        for e, t in zip(self._entries, tensors):
            if e.is_param:
                getattr(e.owner, e.attr).data = t
            else:
                e.owner._buffers[e.attr] = t
        self.version = v
        return v

    def _views(self, view: np.ndarray) -> list[torch.Tensor]:
        with warnings.catch_warnings():  # read-only memory, on purpose
            warnings.simplefilter("ignore", UserWarning)
            whole = torch.from_numpy(view)
        return [whole[e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape)
                for e in self._entries]

    def wait(self, version: int, timeout: float | None = None) -> int:
        """Wait (no CPU) until ``version`` or a later one exists, then :meth:`refresh`;
        the version the model shows. See :meth:`minidist.SharedArray.wait`."""
        self.shared.wait(version, timeout)
        return self.refresh()

    def _refuse_load(self, *args: Any, **kwargs: Any) -> None:
        raise DistError("share_module: this worker's parameters are the learner's shared, "
                        f"read-only weights; load_state_dict on rank {self.src} and publish()")

    def close(self) -> None:
        """Stop sharing: the worker's parameters keep pointing at the version they show
        (read-only memory, kept mapped while they live); call ``refresh`` no more."""
        self.shared.close()
        self._tensors.clear()


def share_module(model: torch.nn.Module, src: int = 0, group: Any = None, *,
                 name: str = "model", buffers: int = DEFAULT_BUFFERS) -> SharedModule:
    """Share ``model``'s weights from global rank ``src`` with every member of ``group``
    (called by each, with a model of the same layout; CollectiveMismatchError on every
    rank otherwise). The learner's current weights become version 1 at once, and every
    worker's model shows them on return. ``name`` tells apart several models shared on
    one group. See :class:`SharedModule` and docs/weights.md."""
    sm = SharedModule(model, src, group, name, buffers)
    if sm.is_src:
        sm.publish()
    sm.shared.wait(1)
    sm.refresh()
    return sm
