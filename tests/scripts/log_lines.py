"""Prints a few numbered lines per rank on stdout and stderr; with
``fail-first``, rank 1 exits with an error in attempt 0, so that a run with
one restart has two attempts."""

import os
import sys

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for line in range(3):
    print(f"rank {rank} attempt {attempt} stdout line {line}", flush=True)
    print(f"rank {rank} attempt {attempt} stderr line {line}", file=sys.stderr, flush=True)
if sys.argv[1:] == ["fail-first"] and attempt == 0 and rank == 1:
    raise SystemExit(f"rank {rank} fails attempt {attempt}")
print(f"rank {rank} done", flush=True)
