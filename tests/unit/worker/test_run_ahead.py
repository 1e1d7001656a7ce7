"""A call run ahead to its first ``load_state`` (``raydist.pool.worker.run_ahead``),
in this process: where it parks, what goes on once released, and what falls
back to running the call from the top. No Ray (the worker's use of it is
checked live in ``tests/live/test_run_ahead.py``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

import pytest

import raydist
from raydist.pool.worker.run_ahead import RunAhead


@pytest.fixture(autouse=True)
def _no_gate_left() -> Iterator[None]:
    yield
    raydist.core.state.set_load_gate(None)


CALLS: Dict[bytes, Any] = {}  # a call's "bytes" -> (fn, args, kwargs): what the worker unpickles


def pickled(fn: Callable[..., Any], *args: Any) -> bytes:
    key = repr((fn, args)).encode()
    CALLS[key] = (fn, args, {})
    return key


def started(call: bytes) -> RunAhead:
    ahead = RunAhead(call, CALLS.__getitem__, pin=lambda: None)
    ahead.start()
    ahead.settle()
    return ahead


def test_the_function_parks_at_its_load_state_and_goes_on_once_released() -> None:
    seen: List[str] = []

    def train(steps: int) -> Dict[str, Any]:
        seen.append("model built")
        resumed = raydist.load_state()  # no store here: None, as on a first attempt
        seen.append("after load_state")
        return {"resumed": resumed, "steps": steps, "thread": threading.current_thread().name}

    call = pickled(train, 3)
    ahead = started(call)
    assert seen == ["model built"] and not ahead.ended.is_set()  # parked
    assert raydist.load_state() is None  # another thread's load_state does not park
    assert ahead.release(call)
    ahead.join()
    assert ahead.passed and ahead.error is None
    assert ahead.value == {"resumed": None, "steps": 3, "thread": "raydist-run-ahead"}
    assert seen == ["model built", "after load_state"]


def test_only_the_first_load_state_parks() -> None:
    def twice() -> str:
        raydist.load_state()
        raydist.load_state()
        return "both"

    call = pickled(twice)
    ahead = started(call)
    assert ahead.release(call)
    ahead.join()
    assert ahead.value == "both"


def test_a_function_that_needs_its_rank_before_load_state_is_not_used() -> None:
    def train() -> int:
        rank = int(os.environ["RAYDIST_TEST_NO_SUCH_RANK"])  # as RANK before the process has one
        raydist.load_state()
        return rank

    call = pickled(train)
    ahead = started(call)
    assert ahead.ended.is_set() and isinstance(ahead.error, KeyError)
    assert not ahead.release(call)  # the call runs from the top instead
    assert not ahead.passed


def test_a_function_without_load_state_is_not_used() -> None:
    call = pickled(lambda: 7)
    ahead = started(call)
    assert ahead.value == 7 and not ahead.release(call) and not ahead.passed


def test_run_ahead_for_another_call_unwinds_past_the_users_except() -> None:
    seen: List[str] = []

    def train() -> None:
        try:
            raydist.load_state()
            seen.append("went on")
        except Exception:  # noqa: BLE001 - what a user's broad except does
            seen.append("swallowed")
        finally:
            seen.append("unwound")

    ahead = started(pickled(train))
    assert not ahead.release(pickled(train, "another argument"))
    ahead.ended.wait(10)
    assert seen == ["unwound"] and type(ahead.error).__name__ == "Discarded"


def test_an_error_after_load_state_is_the_ranks() -> None:
    def train() -> None:
        raydist.load_state()
        raise ValueError("a bug after the load")

    call = pickled(train)
    ahead = started(call)
    assert ahead.release(call)
    ahead.join()
    assert ahead.passed and isinstance(ahead.error, ValueError)


def test_ctrl_c_while_the_main_thread_waits_is_raised_in_the_function() -> None:
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread().ident == main

    def train() -> str:
        raydist.load_state()
        deadline = time.monotonic() + 30
        try:  # from the signal on: the interrupt comes at this thread's next bytecode, which may be the very next
            signal.pthread_kill(main, signal.SIGINT)  # as raydist forwards a Ctrl-C to the rank's process
            while time.monotonic() < deadline:  # Python running: each short sleep returns to the next bytecode
                time.sleep(0.001)  # not `pass`: CPython 3.13.0 raises an interrupt met at a loop's jump outside its try
        except KeyboardInterrupt:
            return "interrupted"
        return "not interrupted"

    call = pickled(train)
    ahead = started(call)
    # SIGINT raises KeyboardInterrupt in the main thread, as in a worker's call (a test runner's own process may ignore it).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert ahead.release(call)
        ahead.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ahead.value == "interrupted", repr(ahead.error)


def test_the_rank_record_is_refused_until_load_state_returns() -> None:
    def train() -> str:
        try:
            raydist.get_context()  # would be a made-up world of one: no rank yet
        except RuntimeError as error:
            refused = str(error)
        raydist.load_state()
        return refused if raydist.get_context().rank == 0 else "no"

    call = pickled(train)
    ahead = started(call)
    assert ahead.release(call)
    ahead.join()
    assert ahead.value == (
        "raydist.get_context() before load_state: this function runs ahead of its rank (run_ahead), which it has once load_state returns"
    )
