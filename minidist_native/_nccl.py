"""A ctypes binding of libnccl: the library torch itself loads (the nvidia-nccl wheel torch
depends on), found and opened without compiling anything, as vLLM's pynccl does.

What it binds: version, unique id, ncclCommInitRankConfig (nonblocking, so that set-up
can be abandoned), all_reduce, broadcast, reduce, all_gather, reduce_scatter, send and
recv with group start/end, abort, destroy, error strings, ncclGetLastError and
ncclCommGetAsyncError. Importing this module loads nothing; :func:`load` does.

Without a GPU, a loaded libnccl still answers ncclGetVersion, ncclGetErrorString and
ncclGetUniqueId (which starts NCCL's bootstrap listener: a TCP socket on an ephemeral
port); ncclCommInitRank fails with ncclUnhandledCudaError.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from dataclasses import dataclass, field

from ._errors import IN_PROGRESS, SUCCESS, nccl_error

#: the oldest NCCL this binding accepts: ncclCommInitRankConfig (nonblocking
#: communicators, so set-up and calls can be abandoned with ncclCommAbort) came in 2.14
MIN_VERSION = (2, 14, 0)
#: environment variable naming the libnccl to load (a path)
LIBRARY_VAR = "MINIDIST_NCCL_LIBRARY"

ncclResult_t = ctypes.c_int
ncclComm_t = ctypes.c_void_p
cudaStream_t = ctypes.c_void_p
buffer_t = ctypes.c_void_p

NCCL_CONFIG_MAGIC = 0xCAFEBEEF
NCCL_CONFIG_UNDEF_INT = -(2 ** 31)


class ncclUniqueId(ctypes.Structure):  # noqa: N801  (NCCL's name)
    _fields_ = [("internal", ctypes.c_byte * 128)]


class ncclConfig_t(ctypes.Structure):  # noqa: N801
    """The first fields of NCCL's ncclConfig_t, as NCCL 2.14 defined it. NCCL copies
    ``size`` bytes of it and, as ``version`` says 2.14, gives every later field its
    default: the layout stays right for every NCCL from 2.14 on."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint),
                ("version", ctypes.c_uint), ("blocking", ctypes.c_int)]


UNIQUE_ID_BYTES = ctypes.sizeof(ncclUniqueId)

# ncclDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FLOAT8E4M3, FLOAT8E5M2 = 6, 7, 8, 9, 10, 11
# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4


def version_code(major: int, minor: int, patch: int) -> int:
    """NCCL_VERSION(major, minor, patch) for NCCL >= 2.9."""
    return major * 10000 + minor * 100 + patch


def parse_version(code: int) -> tuple[int, int, int]:
    """ncclGetVersion's integer as (major, minor, patch): 23203 -> (2, 32, 3); the
    pre-2.9 encoding 2708 -> (2, 7, 8)."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def version_string(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


# (name, restype, argtypes) of every function bound
_FUNCTIONS: list[tuple[str, object, list]] = [
    ("ncclGetVersion", ncclResult_t, [ctypes.POINTER(ctypes.c_int)]),
    ("ncclGetErrorString", ctypes.c_char_p, [ncclResult_t]),
    ("ncclGetLastError", ctypes.c_char_p, [ncclComm_t]),
    ("ncclGetUniqueId", ncclResult_t, [ctypes.POINTER(ncclUniqueId)]),
    ("ncclCommInitRank", ncclResult_t,
     [ctypes.POINTER(ncclComm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int]),
    ("ncclCommInitRankConfig", ncclResult_t,
     [ctypes.POINTER(ncclComm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int,
      ctypes.POINTER(ncclConfig_t)]),
    ("ncclCommGetAsyncError", ncclResult_t, [ncclComm_t, ctypes.POINTER(ncclResult_t)]),
    ("ncclCommAbort", ncclResult_t, [ncclComm_t]),
    ("ncclCommDestroy", ncclResult_t, [ncclComm_t]),
    ("ncclCommCount", ncclResult_t, [ncclComm_t, ctypes.POINTER(ctypes.c_int)]),
    ("ncclCommCuDevice", ncclResult_t, [ncclComm_t, ctypes.POINTER(ctypes.c_int)]),
    ("ncclCommUserRank", ncclResult_t, [ncclComm_t, ctypes.POINTER(ctypes.c_int)]),
    ("ncclAllReduce", ncclResult_t,
     [buffer_t, buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ncclComm_t,
      cudaStream_t]),
    ("ncclBroadcast", ncclResult_t,
     [buffer_t, buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ncclComm_t,
      cudaStream_t]),
    ("ncclReduce", ncclResult_t,
     [buffer_t, buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
      ncclComm_t, cudaStream_t]),
    ("ncclAllGather", ncclResult_t,
     [buffer_t, buffer_t, ctypes.c_size_t, ctypes.c_int, ncclComm_t, cudaStream_t]),
    ("ncclReduceScatter", ncclResult_t,
     [buffer_t, buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ncclComm_t,
      cudaStream_t]),
    ("ncclSend", ncclResult_t,
     [buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ncclComm_t, cudaStream_t]),
    ("ncclRecv", ncclResult_t,
     [buffer_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ncclComm_t, cudaStream_t]),
    ("ncclGroupStart", ncclResult_t, []),
    ("ncclGroupEnd", ncclResult_t, []),
]
# needed at all; the others are looked up lazily (ncclGetLastError came in 2.13 ...)
_REQUIRED = ("ncclGetVersion", "ncclGetErrorString", "ncclGetUniqueId",
             "ncclCommInitRankConfig", "ncclCommGetAsyncError", "ncclCommAbort",
             "ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
             "ncclReduceScatter", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd",
             "ncclCommDestroy")


# ---------------------------------------------------------------------- finding it


@dataclass
class Search:
    """Where libnccl was looked for: ``candidates`` in order (path, how it was found),
    and what went wrong with each that failed."""

    candidates: list[tuple[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, path: str, how: str) -> None:
        if path and all(path != p for p, _ in self.candidates):
            self.candidates.append((path, how))

    def summary(self) -> str:
        if not self.candidates:
            return ("no libnccl found (looked for: $MINIDIST_NCCL_LIBRARY, a libnccl "
                    "already loaded by torch, the nvidia-nccl wheel in sys.path, torch/lib, "
                    "the system library path)")
        return "; ".join(self.failures) or ", ".join(p for p, _ in self.candidates)


def loaded_libraries(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the libnccl shared objects this process has mapped (the one torch
    loaded, when torch is a CUDA build that links the nvidia-nccl wheel)."""
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    seen: list[str] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and "/libnccl.so" in parts[5]:
            path = parts[5].strip()
            if path not in seen:
                seen.append(path)
    return seen


def wheel_libraries(paths: list[str] | None = None) -> list[str]:
    """libnccl of the nvidia-nccl wheels (``nvidia/nccl/lib``; CUDA 13 wheels
    ``nvidia/cu13/lib``) in ``paths`` (default ``sys.path``)."""
    found: list[str] = []
    for base in (sys.path if paths is None else paths):
        if not base or not os.path.isdir(os.path.join(base, "nvidia")):
            continue
        for pattern in ("nvidia/nccl/lib/libnccl.so*", "nvidia/*/lib/libnccl.so*"):
            for p in sorted(glob.glob(os.path.join(base, pattern))):
                if p not in found:
                    found.append(p)
    return found


def search(environ: dict | None = None) -> Search:
    """Every libnccl worth trying, best first: ``$MINIDIST_NCCL_LIBRARY``; a libnccl this
    process already has (torch's); the nvidia-nccl wheel; torch's own lib directory;
    the system's ``libnccl.so.2``."""
    env = os.environ if environ is None else environ
    s = Search()
    explicit = env.get(LIBRARY_VAR, "")
    if explicit:
        s.add(explicit, f"${LIBRARY_VAR}")
    for p in loaded_libraries():
        s.add(p, "already loaded in this process (torch's)")
    for p in wheel_libraries():
        s.add(p, "the nvidia-nccl wheel")
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        lib = os.path.join(os.path.dirname(torch_mod.__file__), "lib")
        for p in sorted(glob.glob(os.path.join(lib, "libnccl.so*"))):
            s.add(p, "torch/lib")
    name = ctypes.util.find_library("nccl")
    if name:
        s.add(name, "the system library path")
    return s


# ---------------------------------------------------------------------- the library


class Library:
    """One loaded libnccl. Methods raise the minidist error of a failed call
    (:func:`minidist_native._errors.nccl_error`); the ``*_raw`` ones return the code."""

    def __init__(self, path: str, how: str = "") -> None:
        self.path = path
        self.how = how
        self._lib = ctypes.CDLL(path)
        self._fn: dict[str, ctypes._CFuncPtr] = {}
        for name, restype, argtypes in _FUNCTIONS:
            try:
                f = getattr(self._lib, name)
            except AttributeError:
                if name in _REQUIRED:
                    raise OSError(f"{path} has no {name} (not a usable libnccl)") from None
                continue
            f.restype = restype
            f.argtypes = argtypes
            self._fn[name] = f
        v = ctypes.c_int()
        self.check(self._fn["ncclGetVersion"](ctypes.byref(v)), "ncclGetVersion")
        self.version_code = v.value
        self.version = parse_version(v.value)

    def __repr__(self) -> str:
        return f"<libnccl {version_string(self.version)} at {self.path}>"

    @property
    def version_str(self) -> str:
        return version_string(self.version)

    def has(self, name: str) -> bool:
        return name in self._fn

    # ------------------------------------------------------------------ errors

    def error_string(self, code: int) -> str:
        s = self._fn["ncclGetErrorString"](code)
        return s.decode(errors="replace") if s else ""

    def last_error(self, comm: int | None = None) -> str:
        f = self._fn.get("ncclGetLastError")
        if f is None:
            return ""
        s = f(comm)
        return s.decode(errors="replace") if s else ""

    def error(self, code: int, call: str, comm: int | None = None, **context) -> Exception:
        """The minidist error for ``code`` (never None: callers pass a failure)."""
        e = nccl_error(code, call=call, text=self.error_string(code),
                       last_error=self.last_error(comm), **context)
        if e is None:  # success / in progress passed by mistake
            raise AssertionError(f"{call}: result {code} is not a failure")
        return e

    def check(self, code: int, call: str, comm: int | None = None, **context) -> int:
        """``code`` if it is ncclSuccess or ncclInProgress; else raise its error."""
        if code not in (SUCCESS, IN_PROGRESS):
            raise self.error(code, call, comm, **context)
        return code

    # ------------------------------------------------------------------ set-up

    def get_unique_id(self) -> bytes:
        """A fresh ncclUniqueId (128 bytes). NCCL starts its bootstrap root listener (a
        TCP socket on an ephemeral port) in this process."""
        uid = ncclUniqueId()
        self.check(self._fn["ncclGetUniqueId"](ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(uid.internal)

    def comm_init_rank(self, nranks: int, uid: bytes, rank: int,
                       blocking: bool = False) -> tuple[int, int]:
        """Start ncclCommInitRankConfig; (the communicator handle, the code: ncclSuccess,
        or ncclInProgress for a nonblocking one still connecting). The caller's current
        CUDA device is the communicator's."""
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"a ncclUniqueId has {UNIQUE_ID_BYTES} bytes, not {len(uid)}")
        u = ncclUniqueId()
        ctypes.memmove(ctypes.byref(u), uid, UNIQUE_ID_BYTES)
        cfg = ncclConfig_t(ctypes.sizeof(ncclConfig_t), NCCL_CONFIG_MAGIC,
                           version_code(*MIN_VERSION), 1 if blocking else 0)
        comm = ncclComm_t()
        code = self._fn["ncclCommInitRankConfig"](ctypes.byref(comm), nranks, u, rank,
                                                  ctypes.byref(cfg))
        if code not in (SUCCESS, IN_PROGRESS):
            e = self.error(code, "ncclCommInitRankConfig", comm.value)
            if comm.value:
                self._fn["ncclCommAbort"](comm.value)
            raise e
        return comm.value or 0, code

    def async_error(self, comm: int) -> int:
        """ncclCommGetAsyncError: ncclSuccess, ncclInProgress, or the failure's code."""
        out = ncclResult_t()
        code = self._fn["ncclCommGetAsyncError"](comm, ctypes.byref(out))
        return code if code not in (SUCCESS,) else out.value

    def abort(self, comm: int) -> int:
        """ncclCommAbort: frees the communicator and stops its uncompleted work; safe
        from any thread, never waits for peers."""
        return self._fn["ncclCommAbort"](comm)

    def destroy(self, comm: int) -> int:
        return self._fn["ncclCommDestroy"](comm)

    def comm_int(self, name: str, comm: int) -> int:
        out = ctypes.c_int()
        self.check(self._fn[name](comm, ctypes.byref(out)), name, comm)
        return out.value

    # ------------------------------------------------------------------ calls (codes)

    def all_reduce_raw(self, send: int, recv: int, count: int, dtype: int, op: int,
                       comm: int, stream: int) -> int:
        return self._fn["ncclAllReduce"](send, recv, count, dtype, op, comm, stream)

    def broadcast_raw(self, send: int, recv: int, count: int, dtype: int, root: int,
                      comm: int, stream: int) -> int:
        return self._fn["ncclBroadcast"](send, recv, count, dtype, root, comm, stream)

    def reduce_raw(self, send: int, recv: int, count: int, dtype: int, op: int, root: int,
                   comm: int, stream: int) -> int:
        return self._fn["ncclReduce"](send, recv, count, dtype, op, root, comm, stream)

    def all_gather_raw(self, send: int, recv: int, count: int, dtype: int, comm: int,
                       stream: int) -> int:
        return self._fn["ncclAllGather"](send, recv, count, dtype, comm, stream)

    def reduce_scatter_raw(self, send: int, recv: int, count: int, dtype: int, op: int,
                           comm: int, stream: int) -> int:
        return self._fn["ncclReduceScatter"](send, recv, count, dtype, op, comm, stream)

    def send_raw(self, buf: int, count: int, dtype: int, peer: int, comm: int,
                 stream: int) -> int:
        return self._fn["ncclSend"](buf, count, dtype, peer, comm, stream)

    def recv_raw(self, buf: int, count: int, dtype: int, peer: int, comm: int,
                 stream: int) -> int:
        return self._fn["ncclRecv"](buf, count, dtype, peer, comm, stream)

    def group_start(self) -> int:
        return self._fn["ncclGroupStart"]()

    def group_end(self) -> int:
        return self._fn["ncclGroupEnd"]()


_loaded: tuple[Library | None, Search] | None = None
_load_lock = threading.Lock()


def load(refresh: bool = False) -> tuple[Library | None, Search]:
    """(the first candidate of :func:`search` that loads as a libnccl, or None; the
    search, with why each candidate failed). Cached; ``refresh`` searches again."""
    global _loaded
    with _load_lock:
        if _loaded is not None and not refresh:
            return _loaded
        s = search()
        lib = None
        for path, how in s.candidates:
            try:
                lib = Library(path, how)
                break
            except OSError as e:
                s.failures.append(f"{path} ({how}): {e}")
        _loaded = (lib, s)
        return _loaded
