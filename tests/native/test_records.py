"""Duplicate-device detection and the choice of path, fed with device records."""

from __future__ import annotations

import pytest

import minidist
from minidist_native._records import DeviceRecord, choose, host_record, shared_devices

pytestmark = pytest.mark.timeout(30)

M = "host-a/boot-1"


def rec(rank, uuid, *, machine=M, node=0, nccl="2.21.5", binding="ctypes", ipc=True,
        force="", visible=()):
    return DeviceRecord(rank=rank, node=node, machine=machine, uuid=uuid, index=rank,
                        nccl=nccl, binding=binding, ipc=ipc, force=force, visible=visible)


def test_records_round_trip_through_bytes():
    r = rec(3, "GPU-x", visible=("GPU-x", "GPU-y"))
    assert DeviceRecord.decode(r.encode()) == r
    # fields a newer peer adds are ignored
    assert DeviceRecord.decode(b'{"rank": 1, "uuid": "u", "future_field": 7}').uuid == "u"


def test_every_rank_on_its_own_gpu_takes_nccl():
    c = choose([rec(0, "GPU-0"), rec(1, "GPU-1"), rec(2, "GPU-2")])
    assert c.path == "nccl" and "2.21.5" in c.reason and c.shared == ()


def test_ranks_sharing_a_gpu_are_detected_and_take_ipc():
    records = [rec(0, "GPU-0"), rec(1, "GPU-0"), rec(2, "GPU-1"), rec(3, "GPU-1"),
               rec(4, "GPU-2")]
    assert shared_devices(records) == {(M, "GPU-0"): [0, 1], (M, "GPU-1"): [2, 3]}
    c = choose(records)
    assert c.path == "ipc"
    assert "[0, 1] share GPU GPU-0" in c.reason and "[2, 3] share GPU GPU-1" in c.reason
    assert dict(c.shared) == {f"{M}/GPU-0": (0, 1), f"{M}/GPU-1": (2, 3)}


def test_the_same_uuid_on_two_machines_is_two_gpus():
    records = [rec(0, "GPU-0", machine="a"), rec(1, "GPU-0", machine="b", node=1)]
    assert shared_devices(records) == {}
    assert choose(records).path == "nccl"


def test_a_shared_gpu_across_machines_stages_through_host():
    records = [rec(0, "GPU-0"), rec(1, "GPU-0"), rec(2, "GPU-9", machine="b", node=1)]
    c = choose(records)
    assert c.path == "host" and "several machines" in c.reason


def test_a_cpu_rank_makes_the_group_stage_through_host():
    c = choose([rec(0, "GPU-0"), host_record(1), rec(2, "GPU-1")])
    assert c.path == "host" and "[1] pass CPU tensors" in c.reason


def test_without_nccl_ipc_serves_one_machine():
    c = choose([rec(0, "GPU-0", nccl=""), rec(1, "GPU-1", nccl="")])
    assert c.path == "ipc" and "no usable NCCL on global ranks [0, 1]" in c.reason
    assert choose([rec(0, "GPU-0", nccl="", ipc=False), rec(1, "GPU-1")]).path == "host"


def test_nccl_needs_one_version_and_one_binding():
    assert choose([rec(0, "a"), rec(1, "b", nccl="2.19.3")]).path == "ipc"
    assert choose([rec(0, "a"), rec(1, "b", binding="torch")]).path == "ipc"


def test_ipc_between_different_gpus_needs_each_to_see_the_others():
    vis = ("GPU-0", "GPU-1")
    ok = [rec(0, "GPU-0", nccl="", visible=vis), rec(1, "GPU-1", nccl="", visible=vis)]
    assert choose(ok).path == "ipc"
    blind = [rec(0, "GPU-0", nccl="", visible=("GPU-0",)),
             rec(1, "GPU-1", nccl="", visible=vis)]
    c = choose(blind)
    assert c.path == "host" and "cannot see" in c.reason


def test_a_forced_path_is_taken_when_it_can_run():
    assert choose([rec(0, "a", force="host"), rec(1, "b", force="host")]).path == "host"
    assert choose([rec(0, "a", force="ipc"), rec(1, "b", force="ipc")]).path == "ipc"


def test_a_forced_path_that_cannot_run_or_disagreement_raise():
    with pytest.raises(minidist.DistError, match="NCCL cannot serve"):
        choose([rec(0, "a", force="nccl"), rec(1, "a", force="nccl")])
    with pytest.raises(minidist.DistError, match="disagree"):
        choose([rec(0, "a", force="nccl"), rec(1, "b", force="host")])
    with pytest.raises(minidist.DistError, match="expected one of"):
        choose([rec(0, "a", force="nvlink")])
    with pytest.raises(minidist.DistError, match="CPU tensors"):
        choose([rec(0, "a", force="ipc"), host_record(1)])
