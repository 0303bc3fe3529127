"""Finding and loading a libnccl with ctypes. The tests that need a libnccl skip when
none is installed (``pip install nvidia-nccl-cu12`` provides one; no GPU is needed for
version, error strings and unique ids)."""

from __future__ import annotations

import ctypes.util
import os

import pytest

from minidist_native import _nccl as N

from .conftest import has_cuda, libnccl
from .jobs import python

pytestmark = pytest.mark.timeout(60)

needs_lib = pytest.mark.skipif(libnccl() is None,
                               reason="no libnccl installed (pip install nvidia-nccl-cu12)")


def test_version_codes():
    assert N.parse_version(23203) == (2, 32, 3)
    assert N.parse_version(21403) == (2, 14, 3)
    assert N.parse_version(2708) == (2, 7, 8)
    assert N.version_code(2, 14, 0) == 21400
    assert N.version_string((2, 21, 5)) == "2.21.5"


def test_the_config_struct_is_the_2_14_prefix():
    assert [f for f, _ in N.ncclConfig_t._fields_] == ["size", "magic", "version",
                                                        "blocking"]
    assert ctypes.sizeof(N.ncclUniqueId) == 128


def test_search_order(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for sub in ("nvidia/nccl/lib", "nvidia/cu13/lib"):
        (site / sub).mkdir(parents=True)
        (site / sub / "libnccl.so.2").write_bytes(b"")
    found = N.wheel_libraries([str(site), str(tmp_path / "nothing")])
    assert found == [str(site / "nvidia/nccl/lib/libnccl.so.2"),
                     str(site / "nvidia/cu13/lib/libnccl.so.2")]
    monkeypatch.setenv(N.LIBRARY_VAR, "/opt/mine/libnccl.so.2")
    s = N.search()
    assert s.candidates[0] == ("/opt/mine/libnccl.so.2", f"${N.LIBRARY_VAR}")


def test_what_torch_loaded_is_read_from_the_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f10-7f11 r-xp 00000000 08:01 2 /venv/nvidia/nccl/lib/libnccl.so.2\n"
        "7f11-7f12 r--p 00001000 08:01 2 /venv/nvidia/nccl/lib/libnccl.so.2\n"
        "7f20-7f21 rw-p 00000000 00:00 0 \n")
    assert N.loaded_libraries(str(maps)) == ["/venv/nvidia/nccl/lib/libnccl.so.2"]
    assert N.loaded_libraries(str(tmp_path / "absent")) == []


def test_a_library_that_is_not_nccl_is_refused():
    libc = ctypes.util.find_library("c")
    with pytest.raises(OSError, match="not a usable libnccl"):
        N.Library(libc)


def test_a_bad_explicit_path_falls_through(monkeypatch):
    monkeypatch.setenv(N.LIBRARY_VAR, "/nonexistent/libnccl.so.2")
    try:
        lib, s = N.load(refresh=True)
        assert any(f.startswith("/nonexistent/libnccl.so.2") for f in s.failures)
        assert (lib is None) == (len(s.candidates) == len(s.failures))
    finally:
        monkeypatch.delenv(N.LIBRARY_VAR)
        N.load(refresh=True)


@needs_lib
def test_the_installed_libnccl_loads_and_answers():
    lib = libnccl()
    assert lib.version >= N.MIN_VERSION
    assert os.path.exists(lib.path)
    assert lib.path in N.loaded_libraries()  # mapped into this process
    assert "remote process" in lib.error_string(6)
    assert "no error" in lib.error_string(0)
    e = lib.error(6, "ncclAllReduce", collective="all_reduce")
    import minidist

    assert isinstance(e, minidist.PeerLostError) and "remote process" in str(e)


@needs_lib
def test_unique_ids_without_a_gpu():
    # in a fresh process: ncclGetUniqueId starts NCCL's bootstrap listener thread
    r = python("from minidist_native import _nccl as N\n"
               "lib, _ = N.load()\n"
               "a, b = lib.get_unique_id(), lib.get_unique_id()\n"
               "print('UID', len(a), len(b), a != b, lib.version_str)\n")
    assert r.returncode == 0, r.stderr
    assert "UID 128 128 True" in r.stdout


@needs_lib
@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_creating_a_communicator_without_a_gpu_is_a_clear_nccl_error():
    r = python("import minidist\n"
               "from minidist_native import _nccl as N, NcclError\n"
               "lib, _ = N.load()\n"
               "uid = lib.get_unique_id()\n"
               "try:\n"
               "    lib.comm_init_rank(1, uid, 0)\n"
               "except NcclError as e:\n"
               "    print('ERR', e.code, e.result, isinstance(e, minidist.DistError))\n"
               "    print('MSG', e)\n")
    assert r.returncode == 0, r.stderr
    assert "ERR 1 ncclUnhandledCudaError True" in r.stdout, r.stdout
    assert "ncclCommInitRankConfig" in r.stdout


@needs_lib
def test_the_unique_id_must_have_128_bytes():
    with pytest.raises(ValueError, match="128 bytes"):
        libnccl().comm_init_rank(1, b"short", 0)
