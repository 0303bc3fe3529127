"""``minidist run`` speaks torchrun's and mpirun's spellings, and a failed job ends with
a summary naming the rank that failed first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .harness import clean_env

pytestmark = pytest.mark.timeout(120)

SHOW_ENV = ("import os; print('ENV', os.environ.get('FOO'), os.environ.get('BAR'), "
            "os.environ['RANK'], os.environ['MASTER_ADDR'], "
            "os.environ['MASTER_PORT'] == os.environ['MINIDIST_PORT'])")


def run(*args: str, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minidist", "run", *args],
                          capture_output=True, text=True, env=env or clean_env(),
                          timeout=timeout)


@pytest.mark.parametrize("spelling", [["-np", "2"], ["--nproc_per_node", "2"],
                                      ["--nproc-per-node=2", "--standalone"]])
def test_torchrun_and_mpirun_spellings(tmp_path, spelling):
    script = tmp_path / "env.py"
    script.write_text(SHOW_ENV)
    r = run(*spelling, "-x", "FOO=1", "-x", "BAR", "--log-dir", str(tmp_path / "logs"),
            str(script), env=clean_env(BAR="bar"))
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if "ENV" in line)
    assert lines == ["[rank0]: ENV 1 bar 0 127.0.0.1 True", "[rank1]: ENV 1 bar 1 127.0.0.1 True"]
    assert (tmp_path / "logs" / "rank1.log").read_text() == "ENV 1 bar 1 127.0.0.1 True\n"


def test_version():
    r = subprocess.run([sys.executable, "-m", "minidist", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("minidist ")


def test_a_failed_job_ends_with_the_first_failure(tmp_path):
    script = tmp_path / "raise.py"
    script.write_text(
        "import numpy as np, minidist\n"
        "minidist.init(timeout=60)\n"
        "minidist.barrier()\n"
        "if minidist.get_rank() == 5:\n"
        "    raise ValueError('boom')\n"
        "x = np.ones(4)\n"
        "while True:\n"
        "    minidist.all_reduce(x)\n")
    r = run("-n", "16", str(script))
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-3:]
    assert "rank 5" in last[0] and "exit code 1" in last[0], last
    assert last[1].endswith("rank 5: ValueError: boom"), last
    assert "0-4,6-15" in last[2], last


def test_log_level_shows_the_chosen_algorithm(tmp_path):
    script = tmp_path / "one.py"
    script.write_text("import numpy as np, minidist\nminidist.init()\n"
                      "minidist.all_reduce(np.ones(3))\n")
    r = run("-n", "2", str(script), env=clean_env(MINIDIST_LOG_LEVEL="debug"))
    assert r.returncode == 0, r.stderr
    assert "minidist rank 1 DEBUG minidist.plan: all_reduce on" in r.stdout + r.stderr
    quiet = run("-n", "2", str(script))
    assert "DEBUG" not in quiet.stdout + quiet.stderr
