"""Device records and the choice of path for one (group, device) (pure: no torch).

When a group makes its first CUDA call, each member publishes a :class:`DeviceRecord`
(what device it called with, on which machine, what it can run) through minidist's
rendezvous. Every member then runs the same :func:`choose` on the same records, so all
agree on the path without another message:

* ``"nccl"``: every member on a GPU of its own, and NCCL usable (same version) on all;
* ``"ipc"``: some members share a GPU (NCCL refuses two ranks on one device in a
  communicator), or NCCL is missing, and all members are on one machine with CUDA IPC;
* ``"host"``: everything else: a member that passes CPU tensors (declared host-only),
  a group across machines with a shared GPU, no IPC. Tensors are staged through host
  memory into minidist's numpy API.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass

from minidist.errors import DistError

PATHS = ("nccl", "ipc", "host")


@dataclass(frozen=True)
class DeviceRecord:
    """What one member brings to a (group, device) communicator.

    ``kind`` is ``"cuda"``, or ``"host"`` for a rank that declared it passes CPU tensors.
    ``machine`` names the OS instance (boot id and host name: CUDA IPC needs one), and
    ``node`` is minidist's node rank. ``uuid`` is the GPU's UUID (physical: the same GPU
    has the same UUID whatever CUDA_VISIBLE_DEVICES says), ``index`` the device index in
    that process. ``nccl`` is the NCCL version this rank can run (empty: none),
    ``binding`` how (``"ctypes"`` or ``"torch"``), ``ipc`` whether CUDA IPC works here,
    ``force`` a path forced by MINIDIST_NATIVE_PATH (empty: none), ``visible`` the
    UUIDs of the GPUs this process can open (CUDA IPC between different GPUs needs each
    member to see the others' GPUs; empty: not reported).
    """

    rank: int
    kind: str = "cuda"
    node: int = 0
    machine: str = ""
    uuid: str = ""
    index: int = -1
    nccl: str = ""
    binding: str = ""
    ipc: bool = False
    force: str = ""
    visible: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> DeviceRecord:
        data = json.loads(raw)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["visible"] = tuple(known.get("visible", ()))
        return cls(**known)

    @property
    def device(self) -> tuple[str, str]:
        """The physical device: (machine, uuid)."""
        return (self.machine, self.uuid)


def host_record(rank: int) -> DeviceRecord:
    return DeviceRecord(rank=rank, kind="host")


def shared_devices(records: list[DeviceRecord]) -> dict[tuple[str, str], list[int]]:
    """The GPUs that more than one member calls with: (machine, uuid) -> global ranks,
    in the records' order. Empty when every member has a GPU of its own."""
    by_device: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in records:
        if r.kind == "cuda":
            by_device[r.device].append(r.rank)
    return {d: ranks for d, ranks in by_device.items() if len(ranks) > 1}


@dataclass(frozen=True)
class Choice:
    """The path a group takes and why (``reason`` is for people)."""

    path: str
    reason: str
    shared: tuple[tuple[str, tuple[int, ...]], ...] = ()


def _forced(records: list[DeviceRecord]) -> str:
    forces = {r.force for r in records if r.force}
    if len(forces) > 1:
        by = {f: [r.rank for r in records if r.force == f] for f in sorted(forces)}
        raise DistError("[minidist_native] the ranks of a group disagree on "
                        f"MINIDIST_NATIVE_PATH: {by}; set it alike on every rank")
    force = forces.pop() if forces else ""
    if force and force not in PATHS:
        raise DistError(f"[minidist_native] MINIDIST_NATIVE_PATH={force!r}: expected one "
                        f"of {', '.join(PATHS)}")
    return force


def choose(records: list[DeviceRecord]) -> Choice:
    """The path for a group whose members (in group-rank order) brought ``records``."""
    if not records:
        raise ValueError("choose: no records")
    force = _forced(records)
    host = [r.rank for r in records if r.kind != "cuda"]
    shared = shared_devices(records)
    shared_t = tuple((f"{m}/{u}", tuple(ranks)) for (m, u), ranks in shared.items())
    one_machine = len({(r.node, r.machine) for r in records}) == 1
    uuids = {r.uuid for r in records}
    ipc_ok = (one_machine and all(r.kind == "cuda" and r.ipc for r in records)
              and all(uuids <= set(r.visible) for r in records if r.visible))
    versions = {r.nccl for r in records}
    bindings = {r.binding for r in records}
    nccl_ok = (not host and not shared and "" not in versions and len(versions) == 1
               and len(bindings) == 1)

    if force == "host":
        return Choice("host", "MINIDIST_NATIVE_PATH=host", shared_t)
    if host:
        if force:
            raise DistError(f"[minidist_native] MINIDIST_NATIVE_PATH={force} but global "
                            f"ranks {host} pass CPU tensors (declared host-only): a group "
                            "with CPU ranks can only stage through host memory")
        return Choice("host", f"global ranks {host} pass CPU tensors: staged through host "
                      "memory", shared_t)
    if force == "nccl" and not nccl_ok:
        raise DistError("[minidist_native] MINIDIST_NATIVE_PATH=nccl, but NCCL cannot serve "
                        f"this group: {_why_not_nccl(records, shared)}")
    if force == "ipc" and not ipc_ok:
        raise DistError("[minidist_native] MINIDIST_NATIVE_PATH=ipc, but CUDA IPC cannot "
                        f"serve this group: {_why_not_ipc(records, one_machine)}")
    if force:
        return Choice(force, f"MINIDIST_NATIVE_PATH={force}", shared_t)
    if nccl_ok:
        return Choice("nccl", f"NCCL {versions.pop()}: every rank on a GPU of its own")
    why = _why_not_nccl(records, shared)
    if ipc_ok:
        return Choice("ipc", f"CUDA IPC ({why})", shared_t)
    return Choice("host", f"host staging ({why}; no CUDA IPC: "
                  f"{_why_not_ipc(records, one_machine)})", shared_t)


def _why_not_nccl(records: list[DeviceRecord], shared: dict) -> str:
    if shared:
        parts = [f"global ranks {ranks} share GPU {uuid or '?'}"
                 for (_, uuid), ranks in shared.items()]
        return "; ".join(parts) + " (NCCL refuses two ranks on one device)"
    missing = [r.rank for r in records if not r.nccl]
    if missing:
        return f"no usable NCCL on global ranks {missing}"
    versions = {r.nccl for r in records}
    if len(versions) > 1:
        return f"the ranks run different NCCL versions {sorted(versions)}"
    bindings = {r.binding for r in records}
    if len(bindings) > 1:
        return f"the ranks bind NCCL differently {sorted(bindings)}"
    return "a CPU rank in the group"


def _why_not_ipc(records: list[DeviceRecord], one_machine: bool) -> str:
    if not one_machine:
        return "the group spans several machines"
    missing = [r.rank for r in records if not r.ipc]
    if missing:
        return f"not available on global ranks {missing}"
    uuids = {r.uuid for r in records}
    blind = [r.rank for r in records if r.visible and not uuids <= set(r.visible)]
    return f"global ranks {blind} cannot see every member's GPU" if blind else "?"
