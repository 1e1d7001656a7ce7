"""A torchrun script that saves its state on SIGTERM (writes DIR/term-<rank>),
ignores SIGUSR1 and otherwise waits forever: what `raydist run` must let it
do when stopped, and what it must not wait for without end."""

import os
import signal
import sys
import threading

out_dir = sys.argv[1]
rank = os.environ["RANK"]


def save_and_exit(signum: int, frame: object) -> None:
    with open(os.path.join(out_dir, f"term-{rank}"), "w") as note:
        note.write(str(signum))
    print(f"rank {rank} saved its state", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a rank that does not stop on this one
print(f"rank {rank} ready", flush=True)
threading.Event().wait()
