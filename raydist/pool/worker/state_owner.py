"""A run's state keeper ends with its driver, however the driver ends.

The primary keeper is detached: it must outlive the rank that created it
and every attempt's group, and the driver releases it when the run ends.
A driver that is killed (SIGKILL, an out-of-memory kill, a lost head)
never does, and Ray ends only what the driver owned, not a detached actor.
So the keeper watches the driver's job: once Ray marks it dead, it writes
the last committed step to ``state_dir`` (``close``) and ends itself; its
holders, which it owns, end with it.
"""

from __future__ import annotations

import sys
import threading

import ray

from raydist.pool.ray_private import job_is_alive

WATCH_INTERVAL_S = 1.0  # seconds between looks at the driver's job (one GCS read each)
CLOSE_TIMEOUT_S = 300.0  # seconds to finish writing the last step to state_dir


def watch_driver() -> None:
    """In the keeper: end it once the job that created it (the driver's) is dead."""
    context = ray.get_runtime_context()
    job, keeper = context.get_job_id(), context.current_actor
    threading.Thread(target=_watch, args=(job, keeper), daemon=True, name="raydist-state-owner").start()


def _watch(job: str, keeper: "ray.actor.ActorHandle") -> None:
    idle = threading.Event()  # never set: a wait that the process's end interrupts
    while job_is_alive(job):
        idle.wait(WATCH_INTERVAL_S)
    print(f"raydist: the driver of job {job} is gone: its training state is released", file=sys.stderr, flush=True)
    try:
        ray.get(keeper.close.remote(), timeout=CLOSE_TIMEOUT_S)  # through the actor's own queue: its loop runs it
    except Exception as error:  # noqa: BLE001 - ended below regardless
        print(f"raydist: could not finish writing state_dir: {error!r}", file=sys.stderr, flush=True)
    ray.kill(keeper, no_restart=True)
