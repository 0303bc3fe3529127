"""The compiled core is optional: an install where no compiler works (``CC=/bin/false``)
succeeds without it, and minidist runs the demo on the pure-Python core, saying so once
per job with how to get the compiled one."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_an_install_without_a_compiler_runs_the_demo_on_the_pure_core(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINIDIST_CORE", "MINIDIST_REQUIRE_CORE", "PYTHONPATH")}
    env["CC"] = "/bin/false"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                            "-w", str(tmp_path / "wheels"), "-q"], capture_output=True,
                           text=True, env=env, timeout=240)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    wheel, = (tmp_path / "wheels").glob("minidist-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "minidist/shm/core.py" in names
    assert not [n for n in names if n.endswith(".so")], names  # the core was not built
    site = tmp_path / "site"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                          "--target", str(site), str(wheel)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    # -S: no site hooks, so an editable install of this checkout does not answer first;
    # numpy from this interpreter's site-packages, after the fresh install
    env["PYTHONPATH"] = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    py = [sys.executable, "-S"]
    run = dict(capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    info = subprocess.run([*py, "-m", "minidist", "info"], **run)
    assert info.returncode == 0 and "core: pure" in info.stdout, info.stdout + info.stderr
    assert str(site) in subprocess.run(
        [*py, "-c", "import minidist; print(minidist.__file__)"], **run).stdout
    demo = subprocess.run([*py, "-m", "minidist", "run", "-n", "4",
                           str(ROOT / "examples" / "demo.py")], **run)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert demo.stdout.count("all_reduce -> 6") == 4, demo.stdout
    assert demo.stderr.count("pure-Python core") == 1, demo.stderr
