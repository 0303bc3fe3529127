"""A learner that never stops while its env workers die and come back.

Rank 0 is the learner; every other rank is an env worker. They step in lockstep: the
learner scatters one action per worker, and gathers one observation per worker. Every
``--commit-every`` steps all of them agree (``minidist.agree``) on whether the block of
steps went through everywhere; if not (a worker died), they shrink the group
(``minidist.shrink_group``) and the learner does the block again with the workers that
are left. A dead worker is started again by the launcher (``--restart-failed``); once
``minidist.wait_ranks`` says it is back, the learner takes it into the group again: it
makes the group (``new_group``) and sends that very group to every member and to the
newcomer (a ``new_group`` call on each of them could differ: a member that dies and is
started again meanwhile is its old process in one call and its new one in another).

    minidist run -n 9 --restart-failed 5 examples/elastic_rl.py --kill-every 1

``--kill-every S`` makes the learner kill a random worker with SIGKILL every S seconds
(for ``--kill-for`` seconds), to show it; the learner prints what it saw at the end:
steps, kills, wrong observations (always 0), shrink times, and how long each killed
worker took to be back in its group.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import threading
import time

import numpy as np

import minidist

STEP, REGROUP, STOP = 0, 1, 2
REJOIN = 11  # tag of the message that tells a restarted worker its group
OBS = 64  # floats per observation


def obs_of(step: int, rank: int, out: np.ndarray) -> None:
    """What worker ``rank`` observes at ``step`` (the learner checks every element)."""
    out[:] = step
    out[0] = step * 1000 + rank
    out[1] = os.getpid()


def block(g, act: np.ndarray, obs: np.ndarray) -> tuple[bool, minidist.Group | None, bool]:
    """A worker's part of one block of steps, until the learner's command ends it:
    (went through here, the next group if regrouping, stop)."""
    rank = minidist.get_rank()
    try:
        while True:
            minidist.scatter(act, None, src=0, group=g)
            cmd, step = int(act[0]), int(act[1])
            if cmd == REGROUP:
                return True, minidist.broadcast_object(None, src=0, group=g), False
            if cmd == STOP:
                return True, None, True
            if step < 0:  # the end of a block of steps
                return True, None, False
            obs_of(step, rank, obs)
            minidist.gather(obs, None, dst=0, group=g)
    except minidist.PeerLostError:
        return False, None, False


def views(g: minidist.Group) -> list | None:
    """Every member's view of the group they shrank to (members, epoch, id), on the
    learner; None elsewhere, or when a member died meanwhile (the next block then fails
    and they shrink again)."""
    try:
        return minidist.gather_object((tuple(g.ranks), g.epoch, g.id), dst=0, group=g)
    except minidist.PeerLostError:
        return None


def worker() -> None:
    everyone = list(range(minidist.get_world_size()))
    if os.environ.get("MINIDIST_RESTART_COUNT"):  # started again: the learner says when
        try:
            g = minidist.recv_object(0, tag=REJOIN)  # the learner's group, as it made it
        except minidist.PeerLostError:  # the learner finished without this worker
            return
        # this rank has heard of every member's process (a member that died since the
        # learner made the group is not waited for long: the group then fails and shrinks)
        minidist.wait_ranks(list(g.ranks), timeout=1.0)
    else:
        g = minidist.new_group(everyone)
    act, obs = np.empty(2), np.empty(OBS)
    while True:
        ok, new, stop = block(g, act, obs)
        if not minidist.agree(ok, group=g):
            g = minidist.shrink_group(group=g)
            views(g)
        elif new is not None:
            g = new
        elif stop:
            return


class Learner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n = minidist.get_world_size()
        self.g = minidist.new_group(list(range(self.n)))
        self.pids: dict[int, int] = {}
        self.killed: dict[int, float] = {}  # rank -> when it was killed (not back yet)
        self.missing: set[int] = set()
        self.kills = self.wrong = self.shrinks = self.steps_redone = 0
        self.views_checked = self.split_views = 0  # survivors' shrunk groups compared
        self.shrink_ms: list[float] = []
        self.back_ms: list[float] = []
        self.lock = threading.Lock()

    def killer(self, stop: threading.Event) -> None:
        """Kill a random worker that is in the group every --kill-every seconds."""
        end = time.monotonic() + self.args.kill_for
        while not stop.wait(self.args.kill_every) and time.monotonic() < end:
            with self.lock:
                ranks = [r for r in self.g.ranks if r != 0 and r in self.pids
                         and r not in self.killed]
                if not ranks:
                    continue
                r = random.choice(ranks)
                try:
                    os.kill(self.pids.pop(r), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed[r] = time.monotonic()
                self.kills += 1

    def steps(self, first: int, count: int, acts: np.ndarray, mine: np.ndarray,
              obs: np.ndarray) -> bool:
        """One block of steps on the current group; True if it went through here."""
        g = self.g
        acts = acts[: 2 * g.size].reshape(g.size, 2)
        got = obs[: OBS * g.size].reshape(g.size, OBS)
        try:
            for step in range(first, first + count):
                acts[:, 0], acts[:, 1] = STEP, step
                minidist.scatter(mine, acts.reshape(-1), src=0, group=g)
                obs_of(step, 0, got[0])
                minidist.gather(got[0].copy(), got.reshape(-1), dst=0, group=g)
                for i, r in enumerate(g.ranks[1:], 1):
                    want = np.full(OBS, float(step))
                    want[0], want[1] = step * 1000 + r, got[i, 1]
                    if not np.array_equal(got[i], want):
                        self.wrong += 1
                    with self.lock:
                        self.pids.setdefault(r, int(got[i, 1]))
            acts[:, 1] = -1  # the end of the block
            minidist.scatter(mine, acts.reshape(-1), src=0, group=g)
            return True
        except minidist.PeerLostError:
            return False

    def commit(self, ok: bool) -> bool:
        """Agree on the block; on failure shrink to the members left."""
        if minidist.agree(ok, group=self.g):
            return True
        t = time.monotonic()
        with self.lock:
            self.g = minidist.shrink_group(group=self.g)
        self.shrink_ms.append(1000 * (time.monotonic() - t))
        self.shrinks += 1
        seen = views(self.g)
        if seen is not None:  # every survivor shrank to the same group
            self.views_checked += 1
            self.split_views += sum(v != seen[0] for v in seen)
        self.missing |= set(range(self.n)) - set(self.g.ranks)
        return False

    def regroup(self, acts: np.ndarray, mine: np.ndarray) -> None:
        """Take the workers that are back into the group, if any."""
        back = minidist.wait_ranks(sorted(self.missing), timeout=0) if self.missing else []
        back = [r for r in back if r not in self.g.ranks]
        if not back:
            return
        # made here only, and sent: every member and every newcomer takes this very group
        new = minidist.new_group(sorted({*self.g.ranks, *back}))
        g = self.g
        ok = True
        try:
            a = acts[: 2 * g.size].reshape(g.size, 2)
            a[:, 0] = REGROUP
            minidist.scatter(mine, a.reshape(-1), src=0, group=g)
            minidist.broadcast_object(new, src=0, group=g)
        except minidist.PeerLostError:
            ok = False
        if not self.commit(ok):
            return
        for r in back:
            minidist.send_object(new, r, tag=REJOIN)
        with self.lock:
            self.g = new
            now = time.monotonic()
            for r in back:
                if r in self.killed:
                    self.back_ms.append(1000 * (now - self.killed.pop(r)))
        self.missing -= set(back)

    def run(self) -> dict:
        args = self.args
        acts, obs = np.zeros(2 * self.n), np.zeros(OBS * self.n)
        mine = np.empty(2)
        stop = threading.Event()
        kthread = None
        if args.kill_every > 0:
            kthread = threading.Thread(target=self.killer, args=(stop,), daemon=True)
            kthread.start()
        t0 = time.monotonic()
        step = 0
        while step < args.steps:
            self.regroup(acts, mine)
            count = min(args.commit_every, args.steps - step)
            if self.commit(self.steps(step, count, acts, mine, obs)):
                step += count
            else:
                self.steps_redone += count
        stop.set()
        if kthread is not None:
            kthread.join()
        # wait for the workers still being restarted, then stop everyone
        deadline = time.monotonic() + args.settle
        while self.missing and time.monotonic() < deadline:
            minidist.wait_ranks(sorted(self.missing), timeout=0.2)
            self.regroup(acts, mine)
        while True:
            a = acts[: 2 * self.g.size].reshape(self.g.size, 2)
            a[:, 0] = STOP
            try:
                minidist.scatter(mine, a.reshape(-1), src=0, group=self.g)
                ok = True
            except minidist.PeerLostError:
                ok = False
            if self.commit(ok):
                break
        elapsed = time.monotonic() - t0

        def p(xs: list[float], q: str) -> float | None:
            if not xs:
                return None
            return round(statistics.median(xs) if q == "p50" else max(xs), 1)

        return {"steps": step, "planned": args.steps, "workers": self.n - 1,
                "kills": self.kills, "wrong": self.wrong, "shrinks": self.shrinks,
                "steps_redone": self.steps_redone, "seconds": round(elapsed, 2),
                "views_checked": self.views_checked, "split_views": self.split_views,
                "steps_per_s": round(step / elapsed, 1),
                "shrink_ms_p50": p(self.shrink_ms, "p50"),
                "shrink_ms_max": p(self.shrink_ms, "max"),
                "back_ms_p50": p(self.back_ms, "p50"), "back_ms_max": p(self.back_ms, "max"),
                "back": len(self.back_ms), "not_back": sorted(self.missing),
                "final_group": list(self.g.ranks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000, help="steps the learner plans")
    ap.add_argument("--commit-every", type=int, default=10,
                    help="steps between two agreements")
    ap.add_argument("--kill-every", type=float, default=0.0,
                    help="kill a random worker every S seconds (0: never)")
    ap.add_argument("--kill-for", type=float, default=1e9,
                    help="stop killing after this many seconds")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds to wait at the end for workers still restarting")
    args = ap.parse_args()
    minidist.init()
    if minidist.get_rank() == 0:
        print("ELASTIC_RL " + json.dumps(Learner(args).run()), flush=True)
    else:
        worker()
    minidist.destroy()


if __name__ == "__main__":
    main()
