"""Run inside a mount namespace whose /dev/shm is full: this process tries to make a
segment again and again (each try fails for room) while a forked child lists /dev/shm
for it, maps what it finds and reads its first words, as a rank looks for another
rank's inbox. Prints the child's fate: "lister: exit 0", or the signal that killed it
(SIGBUS when it mapped a segment whose pages were never given)."""

import mmap
import os
import struct
import sys
import time

from minidist import segments

SIZE = 1 << 16
seconds = float(sys.argv[1])
prefix = "minidist-racejob-1b0c000000000001-"
child = os.fork()
if child == 0:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in segments.named(prefix):
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_size == SIZE:
                    seg = mmap.mmap(fd, SIZE)
                    struct.unpack_from("<qq", seg, 0)  # an inbox's magic and count
                    seg.close()
            except (OSError, ValueError):
                pass
            finally:
                os.close(fd)
    os._exit(0)
end, tries = time.monotonic() + seconds, 0
while time.monotonic() < end:
    try:
        segments.create_open(prefix + str(os.getpid()), SIZE, reserved=4096)
        raise SystemExit("a segment was made on a full /dev/shm")
    except segments.NoRoom:
        tries += 1
_, status = os.waitpid(child, 0)
fate = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
        else f"exit {os.WEXITSTATUS(status)}")
print(f"tries {tries} lister: {fate}", flush=True)
