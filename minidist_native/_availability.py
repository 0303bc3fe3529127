"""``minidist_native.available()``: can this process run NCCL, and if not, why not.

The answer is an :class:`Availability`, falsy when NCCL cannot run here, whose
``reason`` says why in one sentence (no torch, a CPU build of torch, no CUDA device,
no libnccl, a libnccl too old, torch's NCCL bindings unusable). Its other fields say what
was found, so that a machine without a GPU still tells which libnccl it would use.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from . import _nccl as N

BINDING_VAR = "MINIDIST_NATIVE_BINDING"


@dataclass(frozen=True)
class Facts:
    """What :func:`available` looks at (gathered by :func:`gather`; tests make their own)."""

    torch: str | None = None           # torch.__version__, None: not installed
    cuda: str | None = None            # torch.version.cuda, None: a CPU build
    devices: int = 0                   # torch.cuda.device_count()
    visible: str | None = None         # $CUDA_VISIBLE_DEVICES
    library: str | None = None         # the libnccl the ctypes binding opened
    library_version: tuple[int, int, int] | None = None
    library_how: str = ""
    search: str = ""                   # where libnccl was looked for, what failed
    torch_nccl: str | None = None      # torch.cuda.nccl.version(), None: not compiled in
    torch_nccl_ok: bool = False        # torch.cuda.nccl can make communicators
    torch_nccl_why: str = ""
    ipc: bool = False                  # CUDA IPC (events, memory handles) in this build
    binding: str = ""                  # forced binding ($MINIDIST_NATIVE_BINDING)


@dataclass(frozen=True)
class Availability:
    """Whether NCCL can run here (``bool(a)``), why not (``reason``), and what was found.

    ``serves_cuda``: CUDA tensors can be served at all (by NCCL, CUDA IPC or host
    staging); ``binding``: ``"ctypes"`` (libnccl opened with ctypes) or ``"torch"``
    (``torch.cuda.nccl``) when NCCL is usable.
    """

    ok: bool
    reason: str
    serves_cuda: bool = False
    binding: str | None = None
    nccl: str | None = None
    library: str | None = None
    library_version: str | None = None
    torch: str | None = None
    cuda: str | None = None
    devices: int = 0
    torch_nccl: str | None = None
    ipc: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.reason


def judge(f: Facts) -> Availability:
    """The verdict on ``f`` (pure)."""
    notes: list[str] = []
    lib_v = N.version_string(f.library_version) if f.library_version else None
    common = dict(library=f.library, library_version=lib_v, torch=f.torch, cuda=f.cuda,
                  devices=f.devices, torch_nccl=f.torch_nccl)
    if f.library:
        notes.append(f"libnccl {lib_v} at {f.library} ({f.library_how})")
    elif f.search:
        notes.append(f.search)
    if f.torch_nccl and lib_v and f.torch_nccl != lib_v:
        notes.append(f"torch was built with NCCL {f.torch_nccl}, the libnccl found is "
                     f"{lib_v}")

    if f.torch is None:
        return Availability(False, "torch is not installed: minidist_native needs a CUDA "
                            "build of torch", notes=tuple(notes), **common)
    if f.cuda is None:
        return Availability(False, f"no CUDA: torch {f.torch} is a CPU build "
                            "(torch.version.cuda is None)", notes=tuple(notes), **common)
    if f.devices <= 0:
        vis = f" (CUDA_VISIBLE_DEVICES={f.visible!r})" if f.visible is not None else ""
        return Availability(False, f"no CUDA: no CUDA device is visible{vis}",
                            notes=tuple(notes), **common)

    lib_ok = f.library is not None and f.library_version is not None \
        and f.library_version >= N.MIN_VERSION
    want = f.binding
    if want not in ("", "ctypes", "torch"):
        return Availability(False, f"{BINDING_VAR}={want!r}: expected 'ctypes' or 'torch'",
                            serves_cuda=True, ipc=f.ipc, notes=tuple(notes), **common)
    if lib_ok and want in ("", "ctypes"):
        return Availability(True, f"NCCL {lib_v} (libnccl at {f.library}, bound with "
                            f"ctypes) on {f.devices} CUDA device(s)", True, "ctypes", lib_v,
                            ipc=f.ipc, notes=tuple(notes), **common)
    if f.torch_nccl_ok and want in ("", "torch"):
        if f.library is not None and not lib_ok:
            notes.append(f"libnccl {lib_v} is older than {N.version_string(N.MIN_VERSION)}")
        return Availability(True, f"NCCL {f.torch_nccl} through torch.cuda.nccl (roots "
                            "other than 0 emulated, no abort) on "
                            f"{f.devices} CUDA device(s)", True, "torch", f.torch_nccl,
                            ipc=f.ipc, notes=tuple(notes), **common)
    if want == "torch":
        why = f"torch.cuda.nccl: {f.torch_nccl_why}"
    elif f.library is not None and not lib_ok:
        why = (f"libnccl {lib_v} at {f.library} is older than "
               f"{N.version_string(N.MIN_VERSION)}, which minidist_native needs "
               "(ncclCommInitRankConfig: nonblocking, abortable set-up)")
        if f.torch_nccl_why:
            why += f"; torch.cuda.nccl: {f.torch_nccl_why}"
    else:
        why = f"no libnccl: {f.search or 'none found'}"
        if f.torch_nccl_why:
            why += f"; torch.cuda.nccl: {f.torch_nccl_why}"
    return Availability(False, f"no usable NCCL: {why}", serves_cuda=True, ipc=f.ipc,
                        notes=tuple(notes), **common)


def gather() -> Facts:
    """The facts of this process (imports torch; opens libnccl, starts no CUDA work
    beyond torch's device count)."""
    try:
        import torch
    except ImportError:
        lib, s = N.load()
        return Facts(library=lib.path if lib else None,
                     library_version=lib.version if lib else None,
                     library_how=lib.how if lib else "", search=s.summary())
    cuda = torch.version.cuda
    devices = torch.cuda.device_count() if cuda is not None else 0
    lib, s = N.load()
    tn_version = None
    if hasattr(torch._C, "_nccl_version"):
        try:
            v = torch.cuda.nccl.version()
            tn_version = ".".join(str(x) for x in v[:3])
        except Exception:  # noqa: BLE001 - an odd build: no version then
            tn_version = None
    from ._comm import torch_nccl_status

    tn_ok, tn_why = torch_nccl_status()
    ipc = (cuda is not None and hasattr(torch.cuda, "Event")
           and hasattr(torch.cuda.Event, "from_ipc_handle"))
    return Facts(torch=torch.__version__, cuda=cuda, devices=devices,
                 visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                 library=lib.path if lib else None,
                 library_version=lib.version if lib else None,
                 library_how=lib.how if lib else "", search=s.summary(),
                 torch_nccl=tn_version, torch_nccl_ok=tn_ok,
                 torch_nccl_why="" if tn_ok else tn_why, ipc=ipc,
                 binding=os.environ.get(BINDING_VAR, "").strip().lower())


_cached: Availability | None = None
_lock = threading.Lock()


def available(refresh: bool = False) -> Availability:
    """Whether NCCL can run in this process (cached; ``refresh`` looks again)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = judge(gather())
        return _cached
