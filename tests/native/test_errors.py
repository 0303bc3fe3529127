"""NCCL result codes become the minidist errors a CPU user would get."""

from __future__ import annotations

import pytest

import minidist
from minidist_native import NcclError, NcclUsageError
from minidist_native._errors import describe, nccl_error, result_name, unusable

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("code,cls", [
    (1, NcclError), (2, NcclError), (3, NcclError), (4, NcclUsageError),
    (5, NcclUsageError), (6, minidist.PeerLostError), (8, minidist.DistTimeoutError),
    (99, NcclError),
])
def test_every_failure_code_maps_to_a_dist_error(code, cls):
    e = nccl_error(code, call="ncclAllReduce", text="the library's words",
                   last_error="NCCL WARN something", collective="all_reduce",
                   group="G", peers=(3, 4))
    assert type(e) is cls
    assert isinstance(e, minidist.DistError)
    msg = str(e)
    assert "all_reduce" in msg and "the library's words" in msg and "NCCL WARN" in msg
    assert result_name(code) in msg and f"({code})" in msg
    assert e.collective == "all_reduce" and e.group == "G"


def test_success_and_in_progress_are_not_errors():
    assert nccl_error(0, call="x") is None
    assert nccl_error(7, call="x") is None


def test_attributes_of_an_nccl_error():
    e = nccl_error(2, call="ncclCommInitRankConfig", last_error="socket closed")
    assert e.code == 2 and e.result == "ncclSystemError"
    assert e.call == "ncclCommInitRankConfig" and e.last_error == "socket closed"


def test_usage_errors_are_value_errors_and_remote_errors_name_no_rank():
    assert isinstance(nccl_error(4, call="x"), ValueError)
    lost = nccl_error(6, call="x", peers=(1, 2))
    assert lost.ranks == () and lost.left is False and "[1, 2]" in str(lost)


def test_describe_without_the_library_string():
    assert describe(6) == ("ncclRemoteError (6): a remote process exited or there was a "
                           "network error")
    assert result_name(42) == "ncclResult(42)"


def test_a_broken_communicator_keeps_the_error_class():
    first = minidist.PeerLostError("rank 3 died", ranks=(3,), left=False)
    again = unusable(first, "broadcast")
    assert type(again) is minidist.PeerLostError and again.ranks == (3,)
    assert "broadcast: the group is unusable since a call on it failed: rank 3 died" \
        in str(again)
    plain = unusable(RuntimeError("boom"), "all_reduce")
    assert isinstance(plain, minidist.DistError)
