"""Run every benchmark, one process each (each starts its own Ray), and print
how long each took. On a 2-core machine the whole run takes under 10 minutes.

    python benchmarks/run_all.py [--quick] [--only cold_start leaks] [--log out.md]

``--log`` also writes everything printed to a file (the tables are markdown).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import time
from typing import List, Optional, TextIO

HERE = os.path.dirname(os.path.abspath(__file__))
# Name and arguments of each benchmark, in running order. The arguments keep
# the whole run inside its time budget on a small machine.
BENCHMARKS = [
    ("cold_start", ["--reps", "3"]),
    ("warm_call", []),
    ("collectives", ["--row-budget", "15"]),
    ("training", ["--reps", "2"]),
    ("scale", []),
    ("leaks", []),
]


def run_one(name: str, extra: List[str], log: Optional[TextIO]) -> tuple:
    """Run one benchmark, echoing its output; (exit code, seconds)."""
    command = [sys.executable, os.path.join(HERE, f"{name}.py"), *extra]
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # stream the output as it comes
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if "%|" in line:  # raydist's start-up progress bars: not results
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
            if log is not None:
                log.write(line)
    return child.returncode, time.perf_counter() - started


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", nargs="+", choices=[name for name, _ in BENCHMARKS], help="run only these")
    parser.add_argument("--log", help="also write the output to this file")
    args = parser.parse_args(argv)

    sys.path.insert(0, HERE)
    from _common import load_line, machine_line, print_table

    log = open(args.log, "w") if args.log else None
    summary = []
    failed = False
    started = time.perf_counter()
    try:
        banner = f"raydist benchmarks on: {machine_line()}\n"
        sys.stdout.write(banner)
        if log is not None:
            log.write(banner)
        for name, extra in BENCHMARKS:
            if args.only and name not in args.only:
                continue
            code, seconds = run_one(name, extra + (["--quick"] if args.quick else []), log)
            failed |= code != 0
            summary.append([name, f"{seconds:.0f} s", "ok" if code == 0 else f"FAILED (exit {code})"])
        total = time.perf_counter() - started
        summary.append(["total", f"{total:.0f} s ({total / 60:.1f} min)", ""])
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            print_table(f"Benchmark run times ({load_line()} at the end)", ["benchmark", "wall time", "status"], summary)
        sys.stdout.write(table.getvalue())
        if log is not None:
            log.write(table.getvalue())
    finally:
        if log is not None:
            log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
