"""agree() with a death during the call, TRIALS times in one job (--restart-failed):
in trial t, rank 1 + t % (n - 1) dies while the others are inside agree(); each live
member's answer must be the same, and the AND of the live members' flags. The dead rank
is started again, rejoins, learns the trial from rank 0, and the next trial begins."""

import os
import signal
import sys
import time

import minidist

trials = int(sys.argv[1])
minidist.init(timeout=30)
rank, n = minidist.get_rank(), minidist.get_world_size()
everyone = list(range(n))
restarted = int(os.environ.get("MINIDIST_RESTART_COUNT", "0"))
g = minidist.new_group(everyone)
t = minidist.recv_object(0, tag=9) if restarted else 0
bad = 0
while t < trials:
    victim = 1 + t % (n - 1)
    if rank == victim:
        time.sleep(0.05)  # the others are inside agree(), waiting for this rank
        os.kill(os.getpid(), signal.SIGKILL)
    flag = not (rank == t % n and t % 2 == 0)
    value = minidist.agree(flag, group=g)
    expected = all(not (r == t % n and t % 2 == 0) for r in everyone if r != victim)
    small = minidist.shrink_group(group=g)
    answers = minidist.all_gather_object(value, group=small)
    if len(set(answers)) != 1 or value != expected or victim in small.ranks:
        bad += 1
        print(f"BAD trial={t} answers={answers} expected={expected}", flush=True)
    assert minidist.wait_ranks([victim], timeout=20) == [victim]
    t += 1
    g = minidist.new_group(everyone)
    if rank == 0:
        minidist.send_object(t, victim, tag=9)
# the end, decided by the rendezvous (a barrier's last messages could still be on
# their way to a rank when another, done with it, leaves)
assert minidist.agree(True, group=g)
print(f"AGREED rank={rank} restarted={restarted} bad={bad}", flush=True)
