"""Evidence into words: how a worker died, and where hung ranks are."""

from __future__ import annotations

import os
from typing import Dict, Optional

import pytest

from raydist.pool.rules.explain import explain_death, format_stacks, summarize_stack
from raydist.pool.rules.text import ranks_text

RAY_TEXT = "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"


@pytest.mark.parametrize(
    "tail, code, alive, expected",
    [
        ("x\nFatal Python error: Aborted\n", None, True, "killed by SIGABRT"),
        ("*** SIGSEGV received at time=1 on cpu 0 ***", None, True, "killed by SIGSEGV"),
        ("Fatal Python error: Bus error", None, True, "killed by SIGBUS"),
        ("last words", 7, True, "exited with status 7 (os._exit)"),
        ("", None, False, "its node died or left the cluster"),
        ("", None, True, "SIGKILL"),
    ],
)
def test_explain_death(tail: str, code: Optional[int], alive: bool, expected: str) -> None:
    assert expected in explain_death(RAY_TEXT, tail, code, alive)


def test_ray_memory_monitor_is_named() -> None:
    text = "Task was killed due to the node running low on memory."
    assert "OOM" in explain_death(text, "", None, True)


def test_ranks_text_folds_spans() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([8, 0, 1, 2, 3, 4, 5, 6, 10, 11]) == "ranks 0-6, 8, 10-11"


WORKER = os.path.join("site-packages", "raydist", "pool", "worker", "actor.py")
DUMP_IN_BARRIER = f"""Thread 0x00007f0000000001 (most recent call first):
  File "/x/threading.py", line 320 in wait
  File "/x/site-packages/ray/_private/worker.py", line 900 in other

Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4810 in barrier
  File "/home/me/train.py", line 88 in step
  File "/x/{WORKER}", line 172 in execute
  File "/x/site-packages/ray/_private/function_manager.py", line 740 in actor_method_executor
"""
DUMP_IN_USER_CODE = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "/home/me/train.py", line 12 in load_batch
  File "/home/me/train.py", line 90 in step
  File "/x/{WORKER}", line 172 in execute
"""


def test_summarize_finds_the_call_and_the_user_line() -> None:
    summary = summarize_stack(DUMP_IN_BARRIER)
    assert summary.where == "in barrier at distributed_c10d.py:4810, from step at train.py:88"
    assert summary.in_collective
    assert summary.frames[0] == 'File "/home/me/train.py", line 88, in step'
    assert not summarize_stack(DUMP_IN_USER_CODE).in_collective


def test_format_groups_identical_stacks_and_marks_the_odd_rank() -> None:
    dumps: Dict[int, Optional[str]] = {r: DUMP_IN_BARRIER for r in range(64) if r != 7}
    dumps[7] = DUMP_IN_USER_CODE
    text = format_stacks(dumps)
    assert "ranks 0-6, 8-63: in barrier at distributed_c10d.py:4810, from step at train.py:88" in text
    assert "rank 7: in load_batch at train.py:12  <-- differs" in text
    assert text.count("<-- differs") == 1


def test_a_start_up_step_error_loses_rays_decoration_and_keeps_the_message() -> None:
    from raydist.pool.rules.outcomes import step_error_text

    ray_text = (
        "\x1b[36mray::RayWorker.setup()\x1b[39m (pid=29733, ip=192.0.2.2, actor_id=cd1665e6c8e654d1b580e8c601000000, repr=rank=1)\n"
        "           ^^^^^^^^^^^^\n"
        '  File "/x/actor.py", line 148, in setup\n'
        "    context = init_distributed(device=spec.device_type)\n"
        "              ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "RuntimeError: the library is missing on this worker"
    )
    assert step_error_text(ray_text) == (
        '  File "/x/actor.py", line 148, in setup\n'
        "    context = init_distributed(device=spec.device_type)\n"
        "RuntimeError: the library is missing on this worker"
    )


RAYDIST = os.path.join("site-packages", "raydist", "pool", "worker")
THREADING = os.path.join("/x", "threading.py")
# raydist's diagnostics socket and save_state's sender, and Ray's task loop
# waiting for the next call: a rank between calls, as faulthandler dumps it.
OWN_THREADS = f"""Thread 0x00007f0000000003 (most recent call first):
  File "/x/socket.py", line 294 in accept
  File "/x/{RAYDIST}/recorder.py", line 101 in serve
  File "{THREADING}", line 982 in run
  File "{THREADING}", line 1045 in _bootstrap_inner
  File "{THREADING}", line 1002 in _bootstrap

Thread 0x00007f0000000004 (most recent call first):
  File "{THREADING}", line 320 in wait
  File "/x/{RAYDIST}/state_client.py", line 170 in _send
  File "{THREADING}", line 982 in run
  File "{THREADING}", line 1045 in _bootstrap_inner
  File "{THREADING}", line 1002 in _bootstrap
"""
IDLE_DUMP = f"""{OWN_THREADS}
Current thread 0x00007f0000000002 (most recent call first):
  File "/x/site-packages/ray/_private/worker.py", line 1069 in main_loop
  File "/x/site-packages/ray/_private/workers/default_worker.py", line 323 in <module>
"""


def test_a_rank_between_calls_reads_as_idle_not_as_raydists_own_threads() -> None:
    summary = summarize_stack(IDLE_DUMP)
    assert summary.where == "idle (no call running)" and summary.frames == () and not summary.in_collective
    text = format_stacks({0: IDLE_DUMP, 1: IDLE_DUMP})
    assert text == "ranks 0-1: idle (no call running)"
    assert "recorder.py" not in text and "state_client.py" not in text


def test_raydists_own_threads_listed_first_do_not_hide_the_call() -> None:
    summary = summarize_stack(OWN_THREADS + "\n" + DUMP_IN_USER_CODE)
    assert summary.where == "in load_batch at train.py:12"


def test_a_call_deeper_than_faulthandlers_frame_limit_is_not_idle() -> None:
    deep = "".join('  File "/home/me/train.py", line 5 in recurse\n' for _ in range(100))
    dump = f"{OWN_THREADS}\nCurrent thread 0x00007f0000000002 (most recent call first):\n{deep}  ...\n"
    assert summarize_stack(dump).where == "in recurse at train.py:5"
