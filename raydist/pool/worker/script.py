"""Run a torchrun-style script (or ``-m`` module) as ``__main__`` inside a raydist worker.

``raydist run`` sends ``run_script`` to every rank. The worker already has
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so a script that
calls ``dist.init_process_group()`` itself runs unchanged. The script is found
by path on the worker, not shipped: workers on the driver's machine share its
filesystem, and under ``ray job submit --working-dir`` every worker runs in a
copy of the working directory, where the path as typed resolves.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
from types import TracebackType
from typing import Optional, Sequence

from raydist.pool.worker import exit_hooks

# Set by the driver on ranks whose stderr goes to a log file: print an
# uncaught exception there too, as the interpreter would.
TRACEBACK_TO_STDERR_VAR = "RAYDIST_TRACEBACK_TO_STDERR"

__all__ = ["resolve_script", "run_executable", "run_script"]


def resolve_script(path: str, path_as_typed: str) -> str:
    """The script on this machine: ``path`` (as the driver resolved it) if it
    is here, else ``path_as_typed`` relative to this worker's directory. A
    directory with a ``__main__.py`` counts, as for ``python DIR``."""
    for candidate in (path, path_as_typed):
        if os.path.isfile(candidate) or os.path.isfile(os.path.join(candidate, "__main__.py")):
            return os.path.abspath(candidate)
    raise FileNotFoundError(
        f"script {path_as_typed!r} not found on this worker (tried {path!r} and "
        f"{os.path.join(os.getcwd(), path_as_typed)!r}); copy it to every node or "
        "submit the run with `ray job submit --working-dir`"
    )


def _is_launcher_frame(tb: TracebackType) -> bool:
    filename = tb.tb_frame.f_code.co_filename
    return filename in (__file__, runpy.__file__) or filename.startswith("<frozen runpy")


def _user_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback without this module's and runpy's frames, so the report
    starts at the user's code."""
    start = tb
    while start is not None and _is_launcher_frame(start):
        start = start.tb_next
    return start or tb


def run_script(
    target: str,
    script_args: Sequence[str],
    module: bool = False,
    target_as_typed: Optional[str] = None,
) -> None:
    """Run ``target`` as ``__main__`` with ``sys.argv = [target, *script_args]``.

    ``module``: ``target`` is a module name, run like ``python -m`` (the
    working directory goes first on ``sys.path``). Otherwise it is a script
    path; its directory goes first on ``sys.path``, as ``python script.py``
    does. When the script succeeds, a process group it left initialised is
    destroyed; ``sys.argv``, ``sys.path`` and the working directory are
    restored either way, so the worker can run something else afterwards.
    ``SystemExit`` propagates: the worker reports a non-zero code as that
    rank's exit status.
    """
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    succeeded = False
    try:
        if module:
            sys.argv = [target, *script_args]  # run_module replaces argv[0] with the file
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            path = resolve_script(target, target_as_typed or target)
            sys.argv = [path, *script_args]  # run_path sets argv[0] to the path anyway
            if not os.path.isdir(path):  # run_path puts a directory itself first on sys.path
                sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
        succeeded = True
    except SystemExit as stop:
        succeeded = stop.code is None or stop.code == 0
        raise
    except BaseException as error:
        error = error.with_traceback(_user_frames(error.__traceback__))
        if os.environ.get(TRACEBACK_TO_STDERR_VAR):
            # As python prints an uncaught exception (through torch's hook: "[rank1]: ..."),
            # so that the rank's stderr.log holds it, as torchrun's does.
            sys.excepthook(type(error), error, error.__traceback__)
        raise error
    finally:
        _flush()
        exit_hooks.run_recorded()  # the script's atexit handlers, as at the end of its own process
        _flush()  # Ray forwards worker output from files: the last lines must be there
        if succeeded:
            # After a failure the group kills every worker; leaving the process
            # group here would only make the peers fail too ("connection reset").
            _leave_process_group()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        try:
            os.chdir(saved_cwd)
        except OSError:
            pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not mask the result
            pass


def _leave_process_group() -> None:
    """Destroy what the script (or raydist, for ``--backend``) initialised."""
    from raydist.core.initialize import shutdown

    try:
        shutdown()
    except Exception as error:  # noqa: BLE001 - the script's own result matters more
        print(f"raydist: could not destroy the process group: {error}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the worker dies (Linux), so a
    killed group leaves no program behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_executable(program: str, args: Sequence[str]) -> None:
    """torchrun's ``--no-python``: run ``program`` (a path, or a command on
    this worker's PATH) as a child with this rank's environment; its output
    goes where the worker's does. A non-zero status ends the rank with it
    (a signal N as 128+N, as a shell reports it)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    child = subprocess.Popen([program, *args], preexec_fn=_die_with_parent)
    try:
        code = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    if code:
        raise SystemExit(code if code > 0 else 128 - code)
