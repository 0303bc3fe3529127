"""minidist.fdlimits: the soft limit raised, a too-low hard limit named, EMFILE explained."""

from __future__ import annotations

import errno
import resource
import subprocess
import sys

from minidist import fdlimits

from ..processes.harness import ROOT


def _in_child(code: str, soft: int, hard: int) -> str:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                        + code], capture_output=True, text=True, timeout=60,
                       preexec_fn=limit)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_soft_limit_is_raised_to_the_hard_one():
    out = _in_child("from minidist import fdlimits; print(fdlimits.limits(), "
                    "fdlimits.raise_soft_limit())", 100, 900)
    assert out == "(100, 900) (900, 900)"


def test_too_low_names_the_limit_the_need_and_ulimit():
    out = _in_child("from minidist import fdlimits\n"
                    "print(fdlimits.too_low(500, 'x'))\n"
                    "print(fdlimits.too_low(2000, 'a job of 600 ranks'))", 100, 900)
    enough, short = out.splitlines()
    assert enough == "None"  # 500 fit once the soft limit is raised to 900
    assert "a job of 600 ranks needs about 2000" in short and "most 900" in short
    assert "ulimit -n 2000" in short and "hard 900" in short


def test_emfile_and_enfile_become_the_limit_error_and_nothing_else_does():
    e = fdlimits.exhausted(OSError(errno.EMFILE, "Too many open files"), "opening x")
    assert isinstance(e, fdlimits.FileLimitError) and isinstance(e, OSError)
    assert e.errno == errno.EMFILE
    soft, _ = fdlimits.limits()
    assert "while opening x" in str(e) and f"at most {soft}" in str(e) and "ulimit -n" in str(e)
    n = fdlimits.exhausted(OSError(errno.ENFILE, "Too many open files in system"), "y")
    assert n is not None and "fs.file-max" in str(n)
    assert fdlimits.exhausted(OSError(errno.ECONNREFUSED, "refused"), "z") is None
    assert fdlimits.exhausted(ValueError("no"), "z") is None
    assert fdlimits.exhausted(e, "again") is e


def test_the_launchers_need_grows_with_ranks_and_log_files():
    assert fdlimits.launcher_needs(400) == fdlimits.LAUNCHER_BASE + 2 * 400
    assert fdlimits.launcher_needs(400, log_dir=True) == fdlimits.LAUNCHER_BASE + 3 * 400


def test_a_rank_whose_hard_limit_cannot_hold_its_node_fails_at_init_naming_it():
    code = ("import asyncio, minidist\nfrom minidist import env, startup\n"
            "cfg = env.detect({'RANK': '0', 'WORLD_SIZE': '300', 'LOCAL_RANK': '0', "
            "'LOCAL_WORLD_SIZE': '300', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '1', "
            "'MINIDIST_SECRET': 'x'})\n"
            "try:\n    asyncio.run(startup.join(cfg, 5))\n"
            "except minidist.DistError as e:\n    print(type(e).__name__, e)\n")
    out = _in_child(code, 200, 300)
    need = fdlimits.rank_needs(300, True)
    assert out.startswith("FileLimitError") and f"needs about {need}" in out, out
    assert "most 300" in out and "ulimit -n" in out


def test_a_shared_memory_segment_opened_without_descriptors_names_the_limit():
    code = ("import os, resource\nfrom minidist import fdlimits, segments\n"
            "name = f'minidist-test-emfile-{os.getpid()}'\n"
            "segments.create(name, 4096).close()\n"
            "soft = len(os.listdir('/proc/self/fd')) + 2\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, 4096))\n"
            "held = []\n"
            "try:\n    while True:\n        held.append(os.open(os.devnull, os.O_RDONLY))\n"
            "except OSError:\n    pass\n"
            "try:\n    segments.attach(name, 4096)\n"
            "except fdlimits.FileLimitError as e:\n    print('LIMIT', e.errno, e)\n"
            "finally:\n    [os.close(fd) for fd in held]\n    segments.unlink(name)\n")
    out = _in_child(code, 1024, 4096)
    assert out.startswith(f"LIMIT {errno.EMFILE} too many open files (EMFILE) while opening "
                          "the shared-memory segment"), out
    assert "ulimit -n" in out and "holds all it may" in out
