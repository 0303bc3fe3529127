"""The GPU check of minidist_native: one command, under 8 minutes on a GPU machine.

    python benchmarks/gpu_check.py                  # everything; JSON + table in --out
    python benchmarks/gpu_check.py --dry-run        # the plan only (no GPU needed)
    python benchmarks/gpu_check.py --only nccl1,ipc --budget 200

Steps (each in fresh processes, each with its own time limit, all within --budget):

1. env      what minidist_native.available() says; GPUs, torch, NCCL
2. nccl1    a world of one on NCCL: every collective, dtype and op (bf16 included)
3. nccl     every rank on a GPU of its own (only with 2+ GPUs): the same, plus send/recv
4. ipc      2, 4 and 8 ranks sharing GPU 0 through CUDA IPC: every collective, dtype and
            op against a CPU reference (small IPC slots, so tensors cross several chunks)
5. kill     a rank SIGKILLed mid-loop (IPC; and NCCL with 2+ GPUs): the others must raise
            PeerLostError within seconds, not hang
6. ddp      DistributedDataParallel on a small CUDA model through
            init_process_group("minidist"), against the same training on gloo (needs
            minidist.torch to route CUDA tensors to minidist_native; reported as not
            integrated otherwise)
7. bench    all_reduce 1 MiB .. 1 GiB: busbw of CUDA IPC (4, 2 and 8 ranks on one GPU),
            minidist_native's NCCL and torch's own nccl backend (one rank per GPU: with
            one GPU, a world of one, compared by time), and host staging (2 ranks)

Writes ``gpu_check.json`` (every figure) and ``gpu_check.md`` (the tables) into --out and
prints the tables. Exit code 0 when every step that ran passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20
BENCH_SIZES = [MIB << (2 * k) for k in range(6)]  # 1 MiB, 4, 16, 64, 256 MiB, 1 GiB

# (step, ranks, seconds it may take) in the order they run; bench steps last, as they
# can stop early and still report
PLAN = [
    ("env", 1, 30),
    ("nccl1", 1, 60),
    ("nccl", "gpus", 60),
    ("ipc", 2, 60),
    ("ipc", 4, 60),
    ("ipc", 8, 75),
    ("kill-ipc", 3, 40),
    ("kill-nccl", 2, 40),
    ("ddp", 2, 75),
    ("bench-ipc", 4, 50),
    ("bench-ipc1p", 4, 40),
    ("latency", 1, 60),
    ("bench-nccl1", 1, 40),
    ("bench-torch-nccl", "gpus", 40),
    ("bench-ipc", 2, 45),
    ("bench-ipc", 8, 60),
    ("bench-host", 2, 60),
]


# ====================================================================== the driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.version.cuda else 0
    except ImportError:
        return 0


def steps(only: set[str] | None, gpus: int) -> list[tuple[str, int, int, str]]:
    """(step, ranks, time limit, note) to run, in order."""
    out = []
    for name, ranks, limit in PLAN:
        family = name.split("-")[0]
        if only and name not in only and family not in only:
            continue
        n = max(gpus, 1) if ranks == "gpus" else ranks
        note = ""
        if name in ("nccl", "kill-nccl") and gpus < 2:
            note = "skipped: needs 2+ GPUs"
        out.append((name, n, limit, note))
    return out


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "MINIDIST_LAUNCHER")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _launch(cmd: list[str], env: dict[str, str], limit: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True, cwd=ROOT)
    try:
        out, _ = p.communicate(timeout=limit)
        return p.returncode, out, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return 124, out + f"\n[gpu_check] killed after {limit:.0f} s", time.monotonic() - t0
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_step(name: str, n: int, limit: float, outdir: Path, gpus: int) -> dict:
    """One step in fresh processes; its workers leave ``<step>.json`` in ``outdir``."""
    result_file = outdir / f"{name}-{n}.json"
    result_file.unlink(missing_ok=True)
    me = str(Path(__file__).resolve())
    common = ["--result", str(result_file), "--deadline", str(time.time() + limit - 5)]
    extra: dict[str, str] = {"MINIDIST_TIMEOUT": "30"}
    if name in ("nccl1", "env"):
        cmd = [sys.executable, me, "--worker", name, *common]
    elif name == "ddp":
        return _run_ddp(n, limit, outdir, gpus)
    else:
        if name == "ipc":
            extra["MINIDIST_NATIVE_IPC_SLOT_MB"] = "1"
        if name == "bench-host":
            extra["MINIDIST_NATIVE_PATH"] = "host"
        if name in ("bench-torch-nccl", "latency"):
            common += ["--port", str(free_port())]
        if name == "bench-ipc1p":
            extra["GPU_CHECK_IPC_ONE_PHASE"] = "1"
        cmd = [sys.executable, "-m", "minidist", "run", "-n", str(n), "--start-method",
               "spawn", "--grace", "20", me, "--worker", name, *common]
    rc, out, took = _launch(cmd, _env(extra), limit)
    return _collect(name, n, rc, out, took, result_file)


def _run_ddp(n: int, limit: float, outdir: Path, gpus: int) -> dict:
    """DDP under a torchrun-like environment (torch's store bootstraps minidist), once
    with init_process_group("minidist") and once with gloo as the reference."""
    me = str(Path(__file__).resolve())
    t0 = time.monotonic()
    runs: dict[str, dict] = {}
    for backend in ("gloo", "minidist"):
        port = free_port()
        procs = []
        for r in range(n):
            env = _env({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                        "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "MINIDIST_TIMEOUT": "30"})
            out = outdir / f"ddp-{backend}-rank{r}.json"
            out.unlink(missing_ok=True)
            procs.append((subprocess.Popen(
                [sys.executable, me, "--worker", "ddp", "--backend", backend,
                 "--result", str(out), "--deadline", str(time.time() + limit / 2)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True, cwd=ROOT), out))
        logs, ranks = [], []
        for p, out in procs:
            try:
                text, _ = p.communicate(timeout=max(5.0, limit / 2))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                text, _ = p.communicate()
            logs.append(text[-3000:])
            ranks.append(json.loads(out.read_text()) if out.exists() else None)
        runs[backend] = {"ranks": ranks, "log": logs}
    took = time.monotonic() - t0
    ref, got = runs["gloo"]["ranks"], runs["minidist"]["ranks"]
    res = {"step": "ddp", "ranks": n, "seconds": round(took, 1)}
    if any(r is None for r in got) or any(r is None for r in ref):
        res.update(status="FAIL", detail="a rank wrote no result",
                   log=runs["minidist"]["log"] + runs["gloo"]["log"])
        return res
    if any(r.get("status") == "not-integrated" for r in got):
        res.update(status="SKIP", detail="minidist.torch does not route CUDA tensors to "
                   f"minidist_native yet: {got[0].get('error', '')[:300]}")
        return res
    if any(r.get("status") != "ok" for r in got):
        res.update(status="FAIL", detail=str([r.get("error") for r in got])[:1000])
        return res
    import numpy as np

    a = [np.array(r["params"]) for r in got]
    b = np.array(ref[0]["params"])
    same = all(np.array_equal(a[0], x) for x in a)
    close = bool(np.allclose(a[0], b, rtol=1e-4, atol=1e-5))
    api = sorted({f for r in got for f in r.get("api", [])})
    res.update(status="PASS" if same and close and not api else "FAIL",
               detail=f"ranks agree: {same}; matches gloo: {close}; torch API calls on "
                      f"CUDA tensors that failed: {api or 'none'}; "
                      f"max diff {float(np.max(np.abs(a[0] - b))):.2e}; "
                      f"paths {got[0].get('paths')}")
    return res


def _collect(name: str, n: int, rc: int, out: str, took: float, result_file: Path) -> dict:
    res = {"step": name, "ranks": n, "seconds": round(took, 1), "rc": rc}
    data = json.loads(result_file.read_text()) if result_file.exists() else None
    if data is None:
        res.update(status="FAIL", detail=f"no result (exit code {rc})", log=out[-4000:])
        return res
    res.update(data)
    if name.startswith("kill"):
        survivors = data.get("survivors", [])
        ok = (len(survivors) == n - 1
              and all(s.get("error") == "PeerLostError" and (s.get("after_s") or 99) < 30
                      for s in survivors))
        res["status"] = "PASS" if ok else "FAIL"
    elif "status" not in data:
        res["status"] = "PASS" if rc == 0 else "FAIL"
    if res["status"] == "FAIL":
        res["log"] = out[-4000:]
    return res


def table(results: list[dict]) -> str:
    lines = ["| step | ranks | status | seconds | detail |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['step']} | {r['ranks']} | {r['status']} | {r.get('seconds', '')} "
                     f"| {str(r.get('detail', '')).replace('|', '/')[:200]} |")
    bench = [r for r in results if r["step"].startswith("bench") and r.get("rows")]
    if bench:
        lines += ["", "all_reduce (float32), nccl-tests' definitions: algbw = size / time, "
                  "busbw = algbw x 2(n-1)/n", "",
                  "| path | ranks | size | time (us) | algbw (GB/s) | busbw (GB/s) |",
                  "|---|---|---|---|---|---|"]
        for r in bench:
            for row in r["rows"]:
                lines.append(f"| {r['step'][6:]} | {r['ranks']} | {_size(row['bytes'])} | "
                             f"{row['time_us']:.1f} | {row['algbw']:.2f} | {row['busbw']:.2f} |")
    return "\n".join(lines)


def _size(b: int) -> str:
    return f"{b >> 30} GiB" if b >= 1 << 30 else f"{b >> 20} MiB"


def _bytes(b: int) -> str:
    return _size(b) if b >= MIB else f"{b} B"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"),
                    help="where gpu_check.json and gpu_check.md go")
    ap.add_argument("--budget", type=float, default=450.0,
                    help="seconds for the whole check (default 450: under 8 minutes)")
    ap.add_argument("--only", default="", help="steps to run (comma-separated: env, "
                    "nccl1, nccl, ipc, kill, ddp, bench, or full names like bench-host)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    gpus = 0 if args.dry_run else gpu_count()
    plan = steps(only, gpus if not args.dry_run else 2)
    total = sum(limit for _, _, limit, note in plan if not note)
    if args.dry_run:
        print(f"gpu_check plan (budget {args.budget:.0f} s; the step limits add up to "
              f"{total} s, later steps are skipped once the budget is spent):")
        for name, n, limit, note in plan:
            ranks = f"{n} rank(s)"
            if name in ("nccl", "bench-torch-nccl"):
                ranks, note = "one per GPU", "(a world of one with a single GPU)" \
                    if name == "bench-torch-nccl" else "(needs 2+ GPUs)"
            elif name == "kill-nccl":
                note = "(needs 2+ GPUs)"
            print(f"  {name:18s} {ranks:14s} limit {limit:3d} s  {note}")
        print(f"  bench sizes: {', '.join(_size(s) for s in BENCH_SIZES)} (float32)")
        print(f"results: {args.out}/gpu_check.json and gpu_check.md")
        return 0

    if gpus == 0:
        print("[gpu_check] no CUDA device here: nothing to check (--dry-run shows the plan)",
              file=sys.stderr)
        return 2
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results: list[dict] = []
    for name, n, limit, note in plan:
        left = args.budget - (time.monotonic() - start)
        if note:
            results.append({"step": name, "ranks": n, "status": "SKIP", "detail": note})
            continue
        if left < 15:
            results.append({"step": name, "ranks": n, "status": "SKIP",
                            "detail": "skipped: the time budget is spent"})
            continue
        print(f"[gpu_check] {name} ({n} rank(s), up to {min(limit, left):.0f} s) ...",
              flush=True)
        r = run_step(name, n, min(limit, left), outdir, gpus)
        results.append(r)
        print(f"[gpu_check]   {r['status']} in {r.get('seconds', 0)} s "
              f"{str(r.get('detail', ''))[:160]}", flush=True)
        if r["status"] == "FAIL" and r.get("log"):
            print(r["log"][-2000:], flush=True)
    report = {"machine": platform.node(), "python": sys.version.split()[0],
              "gpus": gpus, "seconds": round(time.monotonic() - start, 1),
              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": results}
    (outdir / "gpu_check.json").write_text(json.dumps(report, indent=1))
    md = table(results)
    (outdir / "gpu_check.md").write_text(md + "\n")
    print(md)
    print(f"[gpu_check] {report['seconds']} s; results in {outdir}")
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


# ====================================================================== the workers


def worker(args: argparse.Namespace) -> int:
    return WORKERS[args.worker](args)


def _write(args: argparse.Namespace, data: dict) -> None:
    Path(args.result).write_text(json.dumps(data))


def w_env(args: argparse.Namespace) -> int:
    import torch

    import minidist_native

    a = minidist_native.available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    _write(args, {"status": "PASS" if a else "FAIL", "detail": a.reason,
                  "available": bool(a), "binding": a.binding, "nccl": a.nccl,
                  "library": a.library, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "gpus": gpus, "notes": list(a.notes)})
    return 0


# ---------------------------------------------------------------------- correctness


def _value(rank, dtype, numel, device, salt=0, prod=False):
    import torch

    base = (torch.arange(numel, device=device) * (rank + 3) + rank + salt)
    base = base % 2 + 1 if prod else base % 4  # products of n <= 8 ranks stay exact
    if dtype == torch.bool:
        return base % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.float(), (base % 2).float()).to(dtype)
    return base.to(dtype)


def _ops(dtype):
    from minidist import ReduceOp

    ops = [ReduceOp.SUM, ReduceOp.PRODUCT]
    if not dtype.is_complex:
        ops += [ReduceOp.MIN, ReduceOp.MAX]
    if dtype.is_floating_point or dtype.is_complex:
        ops.append(ReduceOp.AVG)
    else:
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    return ops


def _reference(dtype, op, numel, n, salt=0):
    import torch

    from minidist import ReduceOp
    from minidist_native._dtypes import reduce_into

    prod = op == ReduceOp.PRODUCT
    parts = [_value(r, dtype, numel, "cpu", salt, prod) for r in range(n)]
    out = torch.empty(numel, dtype=dtype)
    reduce_into(out, parts, op)
    return out


def _same(got, want, op=None) -> bool:
    import torch

    from minidist import ReduceOp

    got = got.cpu()
    if op == ReduceOp.AVG:
        wide = torch.complex128 if got.is_complex() else torch.float64
        return bool(torch.allclose(got.to(wide), want.to(wide), rtol=1e-2, atol=1e-2))
    if got.dtype.is_floating_point and got.element_size() == 1:
        return bool(torch.equal(got.view(torch.uint8), want.view(torch.uint8)))
    return bool(torch.equal(got, want))


def w_correct(args: argparse.Namespace) -> int:
    """Every collective, dtype and op on CUDA tensors, against a CPU reference."""
    import torch

    import minidist
    import minidist_native
    from minidist import ReduceOp

    minidist.init(timeout=30)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    dev = torch.device("cuda", 0 if args.worker == "ipc" else rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.complex64]
    big = (1 << 20) + 3  # crosses the 1 MiB IPC slots: several chunks, two phases
    large = {torch.float32, torch.bfloat16, torch.int32, torch.bool}
    checks, failures = 0, []
    roots = sorted({0, n - 1, n // 2})
    t0 = time.monotonic()

    def check(ok: bool, what: str) -> None:
        nonlocal checks
        checks += 1
        if not ok and len(failures) < 20:
            failures.append(what)

    for dtype in dtypes:
        for numel in ((1, 1000, big) if dtype in large else (1, 1000)):
            for op in _ops(dtype):
                x = _value(rank, dtype, numel, dev, prod=op == ReduceOp.PRODUCT)
                minidist_native.all_reduce(x, op)
                check(_same(x, _reference(dtype, op, numel, n), op),
                      f"all_reduce {dtype} {op.name} {numel}")
            for root in roots:
                x = _value(rank, dtype, numel, dev, salt=root)
                minidist_native.broadcast(x, root)
                check(_same(x, _value(root, dtype, numel, "cpu", salt=root)),
                      f"broadcast {dtype} {root}")
                op = ReduceOp.MAX if not dtype.is_complex else ReduceOp.SUM
                x = _value(rank, dtype, numel, dev, salt=1)
                minidist_native.reduce(x, root, op)
                want = _reference(dtype, op, numel, n, 1) if rank == root \
                    else _value(rank, dtype, numel, "cpu", 1)
                check(_same(x, want, op), f"reduce {dtype} {root}")
            out = torch.empty(n * numel, dtype=dtype, device=dev)
            minidist_native.all_gather(out, _value(rank, dtype, numel, dev, 2))
            check(_same(out, torch.cat([_value(r, dtype, numel, "cpu", 2) for r in range(n)])),
                  f"all_gather {dtype} {numel}")
            for op in (ReduceOp.SUM, _ops(dtype)[-1]):
                out = torch.empty(numel, dtype=dtype, device=dev)
                minidist_native.reduce_scatter(out, _value(rank, dtype, n * numel, dev, 3),
                                               op)
                full = _reference(dtype, op, n * numel, n, 3)
                check(_same(out, full[rank * numel:(rank + 1) * numel], op),
                      f"reduce_scatter {dtype} {op.name} {numel}")
    # non-contiguous, async
    x = _value(rank, torch.float32, 600, dev).view(20, 30).t()
    w = minidist_native.all_reduce(x, async_op=True)
    w.wait()
    check(_same(x, _reference(torch.float32, ReduceOp.SUM, 600, n).view(20, 30).t()),
          "all_reduce strided async")
    if n > 1:
        for dtype in (torch.float32, torch.bfloat16):
            t = _value(rank, dtype, 4099, dev)
            got = torch.zeros_like(t)
            right, left = (rank + 1) % n, (rank - 1) % n
            if rank % 2 == 0:
                minidist_native.send(t, right)
                minidist_native.recv(got, left)
            else:
                minidist_native.recv(got, left)
                minidist_native.send(t, right)
            check(_same(got, _value(left, dtype, 4099, "cpu")), f"send/recv {dtype}")
    paths = sorted({c["path"] for c in minidist_native.communicators()
                    if not c["key"].startswith("pair")})
    want_path = "ipc" if args.worker == "ipc" else "nccl"
    check(paths == [want_path], f"path {paths}, expected {want_path}")
    import numpy as np

    failed = np.array([len(failures)], dtype=np.int64)
    minidist.all_reduce(failed)  # on every rank
    if rank == 0:
        _write(args, {"status": "PASS" if not failed[0] else "FAIL",
                      "detail": f"{checks} checks per rank, {int(failed[0])} failed (all "
                                f"ranks); path {paths}; rank 0: " + "; ".join(failures[:5]),
                      "checks": checks, "failures": failures,
                      "communicators": minidist_native.communicators(),
                      "check_seconds": round(time.monotonic() - t0, 1)})
    minidist.destroy()
    return 0 if not failures else 1


# ---------------------------------------------------------------------- a killed rank


def w_kill(args: argparse.Namespace) -> int:
    import torch

    import minidist
    import minidist_native

    minidist.init(timeout=30)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    dev = torch.device("cuda", 0 if args.worker == "kill-ipc"
                       else rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    x = torch.ones(4 * MIB, device=dev)
    store = minidist.get_store()
    for _ in range(5):
        minidist_native.all_reduce(x)
    minidist.barrier()
    if rank == n - 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    outcome = {"rank": rank, "error": None, "after_s": None}
    try:
        while time.monotonic() - t0 < 60:
            minidist_native.all_reduce(x)
        outcome["error"] = "HANG-or-no-error"
    except minidist.DistError as e:
        outcome.update(error=type(e).__name__, message=str(e)[:300])
    outcome["after_s"] = round(time.monotonic() - t0, 2)
    # the survivors tell rank 0 (or, if rank 0 is the victim, nobody is left to)
    try:
        store.set(f"gpu_check/kill/{rank}", json.dumps(outcome))
    except minidist.DistError:
        pass
    if rank == 0:
        got = []
        for r in range(n - 1):
            try:
                got.append(json.loads(store.get(f"gpu_check/kill/{r}", timeout=10)))
            except minidist.DistError:
                got.append({"rank": r, "error": "no report"})
        _write(args, {"survivors": got,
                      "detail": "; ".join(f"rank {s['rank']}: {s['error']} after "
                                          f"{s.get('after_s')} s" for s in got),
                      "communicators": minidist_native.communicators()})
    os._exit(0)


# ---------------------------------------------------------------------- DDP


def w_ddp(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", 0 if torch.cuda.device_count() < 2
                       else rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    out: dict = {"rank": rank}
    try:
        if args.backend == "minidist":
            import minidist.torch  # noqa: F401  (registers the backend)
        tdist.init_process_group(args.backend)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8)).to(dev)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * rank)  # DDP's first broadcast must even them out
        ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(1234 + rank)
        for _ in range(20):
            x = torch.randn(64, 32, generator=gen).to(dev)
            y = torch.randn(64, 8, generator=gen).to(dev)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        out["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                                  ).cpu().tolist()
        if args.backend == "minidist":  # (gloo's send of a CUDA tensor can crash it)
            out["api"] = _torch_api_checks(tdist, rank, tdist.get_world_size(), dev)
        out["status"] = "ok"
        if args.backend == "minidist":
            import minidist_native

            out["paths"] = sorted({c["path"] for c in minidist_native.communicators()})
        tdist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the driver
        text = f"{type(e).__name__}: {e}"
        out["error"] = text[:2000]
        out["status"] = ("not-integrated" if "CPU tensors only" in text
                         or "CUDA tensors are not supported" in text
                         or "serves CPU tensors only" in text else "error")
    _write(args, out)
    return 0


def _torch_api_checks(tdist, rank: int, n: int, dev) -> list[str]:
    """torch.distributed's calls on CUDA tensors (besides DDP's); the failures."""
    import torch

    bad = []
    x = torch.full((1000,), float(rank + 1), device=dev)
    w = tdist.all_reduce(x, async_op=True)
    w.wait()
    if not torch.all(x == n * (n + 1) / 2):
        bad.append("all_reduce async")
    f = tdist.all_reduce(x, op=tdist.ReduceOp.MAX, async_op=True).get_future()
    f.wait()
    if not torch.all(x == n * (n + 1) / 2):
        bad.append("all_reduce future")
    b = torch.full((77,), float(rank), device=dev)
    tdist.broadcast(b, src=n - 1)
    if not torch.all(b == n - 1):
        bad.append("broadcast")
    out = torch.empty(n * 5, device=dev)
    tdist.all_gather_into_tensor(out, torch.full((5,), float(rank), device=dev))
    if not torch.equal(out.cpu(), torch.arange(n).repeat_interleave(5).float()):
        bad.append("all_gather_into_tensor")
    lst = [torch.empty(3, device=dev) for _ in range(n)]
    tdist.all_gather(lst, torch.full((3,), float(rank), device=dev))
    if any(not torch.all(t == i) for i, t in enumerate(lst)):
        bad.append("all_gather")
    rs = torch.empty(4, device=dev)
    tdist.reduce_scatter_tensor(rs, torch.arange(4 * n, device=dev, dtype=torch.float32))
    if not torch.equal(rs.cpu(), n * torch.arange(4 * rank, 4 * rank + 4).float()):
        bad.append("reduce_scatter_tensor")
    if n > 1:
        msg = torch.full((9,), 42.0 + rank, device=dev)
        got = torch.empty(9, device=dev)
        if rank == 0:
            tdist.send(msg, 1)
            tdist.recv(got, 1)
        elif rank == 1:
            tdist.recv(got, 0)
            tdist.send(msg, 0)
        if rank < 2 and not torch.all(got == 42.0 + (1 - rank)):
            bad.append("send/recv")
    torch.cuda.synchronize()
    return bad


# ---------------------------------------------------------------------- bandwidth


def _sweep(n: int, deadline: float, once, sync, rank: int) -> list[dict]:
    """Time ``once(nbytes)`` per size (adaptive repeats); the slowest rank's time."""
    import numpy as np

    import minidist

    rows = []
    for nbytes in BENCH_SIZES:
        go = np.array([1 if time.time() < deadline - 10 else 0], dtype=np.int64)
        minidist.all_reduce(go, minidist.ReduceOp.MIN)
        if not go[0]:
            break
        once(nbytes)  # warm-up (and set-up)
        sync()
        iters, spent = 0, 0.0
        while iters < 2 or (spent < 0.5 and iters < 20):
            minidist.barrier()
            t0 = time.perf_counter()
            once(nbytes)
            sync()
            spent += time.perf_counter() - t0
            iters += 1
        t = np.array([spent / iters])
        minidist.all_reduce(t, minidist.ReduceOp.MAX)
        algbw = nbytes / t[0] / 1e9
        rows.append({"bytes": nbytes, "iters": iters, "time_us": t[0] * 1e6,
                     "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n if n > 1 else 0.0})
    return rows


def w_bench(args: argparse.Namespace) -> int:
    import torch

    import minidist
    import minidist_native

    minidist.init(timeout=60)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    bufs: dict[int, torch.Tensor] = {}

    def once(nbytes: int) -> None:
        if nbytes not in bufs:
            bufs.clear()
            bufs[nbytes] = torch.ones(nbytes // 4, device=dev)
        minidist_native.all_reduce(bufs[nbytes])

    if os.environ.get("GPU_CHECK_IPC_ONE_PHASE"):  # every rank reduces whole chunks
        import minidist_native._ipc as ipc

        ipc.TWO_PHASE_BYTES = 1 << 62
    # the values first, at sizes that make IPC slots grow (and cross chunks past 256 MiB)
    wrong = []
    for numel in (3 << 20, (80 << 20) + 5):
        x = torch.arange(numel, device=dev, dtype=torch.float32) % 7 + rank
        minidist_native.all_reduce(x)
        want = (torch.arange(numel, device=dev, dtype=torch.float32) % 7) * n + n * (n - 1) / 2
        if not torch.equal(x, want):
            wrong.append(f"all_reduce of {numel} floats: wrong values")
    rows = _sweep(n, args.deadline, once, torch.cuda.synchronize, rank)
    if rank == 0:
        _write(args, {"status": "FAIL" if wrong else "PASS", "rows": rows,
                      "paths": [c["path"] for c in
                                              minidist_native.communicators()],
                      "detail": f"{len(rows)} sizes; path "
                                f"{[c['path'] for c in minidist_native.communicators()]}"
                                + (f"; {wrong}" if wrong else "")})
    minidist.destroy()
    return 0


def w_bench_torch(args: argparse.Namespace) -> int:
    """torch's own nccl backend (one rank per GPU), timed the same way."""
    import torch
    import torch.distributed as tdist

    import minidist

    minidist.init(timeout=60)  # for the sweep's bookkeeping only (CPU)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    tdist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                             world_size=n, device_id=dev)
    bufs: dict[int, torch.Tensor] = {}

    def once(nbytes: int) -> None:
        if nbytes not in bufs:
            bufs.clear()
            bufs[nbytes] = torch.ones(nbytes // 4, device=dev)
        tdist.all_reduce(bufs[nbytes])

    rows = _sweep(n, args.deadline, once, torch.cuda.synchronize, rank)
    if rank == 0:
        _write(args, {"rows": rows, "detail": f"{len(rows)} sizes; torch "
                      f"{torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
                      + ("; one GPU: a world of one (busbw is 0 by definition)"
                         if n == 1 else "")})
    tdist.destroy_process_group()
    minidist.destroy()
    return 0


def w_latency(args: argparse.Namespace) -> int:
    """A world of one: the time of one small all_reduce (+ synchronize) through
    minidist_native's NCCL and through torch's nccl backend, interleaved in one process;
    and where minidist_native's time goes (cProfile)."""
    import cProfile
    import io
    import pstats

    import torch
    import torch.distributed as tdist

    import minidist
    import minidist_native

    minidist.init(timeout=60)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    tdist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=0,
                             world_size=1, device_id=dev)
    rows = []
    for numel in (1, 1 << 18, 1 << 26):
        x = torch.ones(numel, device=dev)
        y = torch.ones(numel, device=dev)
        for _ in range(50):
            minidist_native.all_reduce(x)
            tdist.all_reduce(y)
        torch.cuda.synchronize()
        ours, theirs = [], []
        for _ in range(5):
            for fn, t, acc in ((minidist_native.all_reduce, x, ours),
                               (tdist.all_reduce, y, theirs)):
                t0 = time.perf_counter()
                for _ in range(200):
                    fn(t)
                    torch.cuda.synchronize()
                acc.append((time.perf_counter() - t0) / 200 * 1e6)
        rows.append({"bytes": numel * 4, "minidist_us": min(ours), "torch_us": min(theirs),
                     "ratio": min(ours) / min(theirs)})
    prof = cProfile.Profile()
    x = torch.ones(1, device=dev)
    prof.enable()
    for _ in range(500):
        minidist_native.all_reduce(x)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    worst = max(r["ratio"] for r in rows)
    _write(args, {"status": "PASS" if worst <= 1.0 else "SLOWER", "rows_latency": rows,
                  "detail": "; ".join(f"{_bytes(r['bytes'])}: minidist "
                                      f"{r['minidist_us']:.1f} us, torch "
                                      f"{r['torch_us']:.1f} us (x{r['ratio']:.2f})"
                                      for r in rows),
                  "profile": text.getvalue()[-6000:]})
    tdist.destroy_process_group()
    minidist.destroy()
    return 0


WORKERS = {"env": w_env, "nccl1": w_correct, "nccl": w_correct, "ipc": w_correct,
           "kill-ipc": w_kill, "kill-nccl": w_kill, "ddp": w_ddp, "bench-ipc": w_bench,
           "bench-nccl1": w_bench, "bench-ipc1p": w_bench, "latency": w_latency,
           "bench-host": w_bench, "bench-torch-nccl": w_bench_torch}

if __name__ == "__main__":
    sys.exit(main())
