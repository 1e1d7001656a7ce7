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
import sys
from types import TracebackType
from typing import Optional, Sequence

__all__ = ["resolve_script", "run_script"]


def resolve_script(path: str, path_as_typed: str) -> str:
    """The script file on this machine: ``path`` (as the driver resolved it) if
    it is here, else ``path_as_typed`` relative to this worker's directory."""
    for candidate in (path, path_as_typed):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise FileNotFoundError(
        f"script {path_as_typed!r} not found on this worker (tried {path!r} and "
        f"{os.path.join(os.getcwd(), path_as_typed)!r}); copy it to every node or "
        "submit the run with `ray job submit --working-dir`"
    )


def _user_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback without this module's and runpy's frames, so the report
    starts at the user's code."""
    skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    start = tb
    while start is not None and os.path.abspath(start.tb_frame.f_code.co_filename) in skip:
        start = start.tb_next
    return start or tb


def run_script(target: str, script_args: Sequence[str], module: bool = False, target_as_typed: Optional[str] = None) -> None:
    """Run ``target`` as ``__main__`` with ``sys.argv = [target, *script_args]``.

    ``module``: ``target`` is a module name, run like ``python -m`` (the
    working directory goes first on ``sys.path``). Otherwise it is a script
    path; its directory goes first on ``sys.path``, as ``python script.py``
    does. A process group the script leaves initialised is destroyed, and
    ``sys.argv``, ``sys.path`` and the working directory are restored, so the
    worker can run something else afterwards. ``SystemExit`` propagates: the
    worker reports a non-zero code as that rank's exit status.
    """
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    try:
        if module:
            sys.argv = [target, *script_args]  # run_module replaces argv[0] with the file
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            path = resolve_script(target, target_as_typed or target)
            sys.argv = [path, *script_args]  # run_path sets argv[0] to the path anyway
            sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as error:  # noqa: B036 - re-raised with a shorter traceback
        raise error.with_traceback(_user_frames(error.__traceback__))
    finally:
        # Ray forwards worker output from files; flush so the last lines are there.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not mask the result
                pass
        _leave_process_group()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        try:
            os.chdir(saved_cwd)
        except OSError:
            pass


def _leave_process_group() -> None:
    """Destroy what the script (or raydist, for ``--backend``) initialised."""
    from raydist.initialize import shutdown

    try:
        shutdown()
    except Exception as error:  # noqa: BLE001 - the script's own result matters more
        print(f"raydist: could not destroy the process group: {error}", file=sys.stderr, flush=True)

