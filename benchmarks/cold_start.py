"""Cold start: one whole no-op distributed call, from nothing to torn down.

On an already-initialised local Ray, for N workers, times:

* raydist     ``raydist.run(noop, num_workers=N)``: place, start, init gloo,
              run, tear down;
* floor       bare Ray actors: spawn, ``import torch``, gloo init on a TCP
              address, barrier, kill (what any Ray launcher must at least do);
* TorchTrainer ``TorchTrainer(noop).fit()`` from ray[train], same no-op;
* torchrun    ``python -m torch.distributed.run --standalone`` as a whole
              process, its script doing gloo init + barrier.

Then, as whole processes from the shell (interpreter start to exit), N=2:

* raydist run, no Ray running  ``python -m raydist run -n 2 --accelerator cpu
              --standalone cold_start.py --torchrun-worker``: starts and stops
              a private Ray (``--standalone`` is the path a plain ``raydist
              run`` takes when no cluster is running; it also keeps the run
              off any other Ray on the machine);
* raydist run, attached  the same with ``--address`` of a ``ray start --head``
              cluster this script starts (private temp dir, token auth as
              the installed Ray defaults) and stops afterwards;
* torchrun    ``torchrun --standalone --nproc-per-node 2`` of the same
              script, interleaved with each of the two, for the ratios.

Methods are interleaved (one sample of each per round) so slow drift on a
small machine hits them alike; a warm-up round is not counted. The
whole-process comparison runs first, before this script starts a Ray of its
own; nothing is left running.

    python benchmarks/cold_start.py [--reps 3] [--sizes 2 4] [--cli-reps 5] [--quick]
    python benchmarks/cold_start.py --cli-only     # just the whole-process comparison
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable, Dict, List, Optional, Sequence, Tuple

TARGET_VS_FLOOR = 1.15  # raydist.run() at most this many times the floor
TARGET_VS_TRAINER = 5.0  # TorchTrainer at least this many times raydist
TARGET_CLI_VS_TORCHRUN = 1.5  # `raydist run` from nothing at most this many times torchrun
TARGET_ATTACHED_VS_TORCHRUN = 1.0  # `raydist run` attached to a running cluster
PROCESS_TIMEOUT_S = 300.0
LEFTOVER_WAIT_S = 10.0


def torchrun_worker() -> None:
    """The torchrun script: what a no-op job needs (gloo init + barrier)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def noop() -> None:
    return None


def noop_train_fn() -> None:
    return None


class FloorWorker:
    """A bare actor: the least a Ray launcher has to do per rank."""

    def init_and_barrier(self, rank: int, world_size: int, port: int) -> int:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        dist.barrier()
        dist.destroy_process_group()
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()


def time_raydist(n: int) -> float:
    import raydist

    start = time.perf_counter()
    raydist.run(noop, num_workers=n)
    return time.perf_counter() - start


def make_time_floor() -> Callable[[int], float]:
    import ray
    from _common import free_port

    remote_worker = ray.remote(num_cpus=1)(FloorWorker)

    def time_floor(n: int) -> float:
        start = time.perf_counter()
        actors = [remote_worker.remote() for _ in range(n)]
        port = free_port()
        ray.get([actor.init_and_barrier.remote(rank, n, port) for rank, actor in enumerate(actors)])
        for actor in actors:
            ray.kill(actor, no_restart=True)
        # Wait until Ray knows they are dead, as raydist's teardown does.
        ray.wait([actor.ping.remote() for actor in actors], num_returns=n, timeout=5.0)
        return time.perf_counter() - start

    return time_floor


def torchrun_command(n: int) -> List[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        os.path.abspath(__file__),
        "--torchrun-worker",
    ]


def raydist_run_command(n: int, address: Optional[str] = None) -> List[str]:
    """``raydist run`` of the torchrun script: a private Ray, or ``address``'s cluster."""
    where = ["--address", address] if address else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "raydist",
        "run",
        "-n",
        str(n),
        "--accelerator",
        "cpu",
        *where,
        os.path.abspath(__file__),
        "--torchrun-worker",
    ]


def _session_members(sid: int) -> List[int]:
    """Pids of the processes in session ``sid`` (what a timed command left)."""
    import psutil

    members = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid:
                members.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return members


def run_timed(command: Sequence[str], what: str, env: Optional[Dict[str, str]] = None) -> float:
    """Wall time of ``command`` as a whole process. It runs in a session of its
    own; whatever it leaves behind in that session (a Ray daemon that outlived
    it) is waited for, outside the timing, then killed and reported."""
    start = time.perf_counter()
    child = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = child.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise RuntimeError(f"{what} did not finish within {PROCESS_TIMEOUT_S:g} s") from None
    elapsed = time.perf_counter() - start
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = _session_members(child.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _session_members(child.pid)
    for pid in left:  # ours: started by the command above
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if child.returncode != 0:
        raise RuntimeError(f"{what} exited {child.returncode}: {(err or out)[-2000:]}")
    if left:
        raise RuntimeError(f"{what} left {len(left)} process(es) running {LEFTOVER_WAIT_S:g} s after it exited (killed)")
    return elapsed


def time_torchrun(n: int) -> float:
    return run_timed(torchrun_command(n), "torchrun")


def _ray_auth_env() -> Dict[str, str]:
    """Environment for the head and the attached run: token authentication as
    this Ray enables it for a new cluster, unless RAY_AUTH_MODE says otherwise
    (a driver given an explicit address only sends a token when told to)."""
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "token")
    env.pop("RAY_ADDRESS", None)
    return env


class RayHead:
    """A ``ray start --head --block`` cluster of this script's own: its own temp
    dir (so no other ``ray.init()`` on the machine finds it), no dashboard, a
    free GCS port. Stopped by SIGTERM to that ``ray start`` (never ``ray stop``,
    which would stop every Ray on the machine)."""

    def __init__(self, env: Dict[str, str]):
        from _common import free_port

        self._env = {**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # no drain wait on SIGTERM
        self.temp_dir = tempfile.mkdtemp(prefix="rdcs-")
        self.port = free_port()
        self.address: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 120.0) -> str:
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        command = [
            ray_cli if os.path.exists(ray_cli) else "ray",
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            "--include-dashboard=false",
            "--dashboard-agent-listen-port=0",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        self._log = open(os.path.join(self.temp_dir, "ray_start.log"), "w")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=self._env, start_new_session=True)
        address_file = os.path.join(self.temp_dir, "ray_current_cluster")  # written once the node is up
        deadline = time.monotonic() + timeout
        while not os.path.exists(address_file) or not open(address_file).read().strip():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._log.flush()
                tail = open(os.path.join(self.temp_dir, "ray_start.log")).read()[-2000:]
                raise RuntimeError(f"ray start --head did not come up: {tail}")
            time.sleep(0.2)
        self.address = open(address_file).read().strip()
        return self.address

    def stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGTERM)
                try:
                    self._process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self._process.pid, signal.SIGKILL)
                    self._process.wait()
            # Anything of this cluster still alive (named by its temp dir) is ours.
            deadline = time.monotonic() + LEFTOVER_WAIT_S
            while self._leftovers() and time.monotonic() < deadline:
                time.sleep(0.2)
            for process in self._leftovers():
                try:
                    process.kill()
                except Exception:  # noqa: BLE001 - gone already
                    pass
            self._log.close()
            self._process = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _leftovers(self) -> list:
        """This cluster's processes still alive: those in the session of its
        ``ray start`` (workers included), or naming its temp dir."""
        import psutil

        sid = self._process.pid if self._process is not None else None
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if (sid is not None and os.getsid(process.pid) == sid) or any(
                    self.temp_dir in part for part in process.info["cmdline"] or ()
                ):
                    found.append(process)
            except (OSError, psutil.Error):
                continue
        return found


def interleave(
    methods: Dict[str, Callable[[], float]], reps: int, label: str, before_sample: Optional[Callable[[str], None]] = None
) -> Tuple[Dict[str, List[float]], Dict[str, str]]:
    """One warm-up round, then ``reps`` timed rounds of every method in turn."""
    from _common import wait_for_quiet_cpu

    samples: Dict[str, List[float]] = {name: [] for name in methods}
    failed: Dict[str, str] = {}
    for round_index in range(1 + reps):
        for name, timer in methods.items():
            if name in failed:
                continue
            wait_for_quiet_cpu()
            if before_sample is not None:
                before_sample(name)
            try:
                elapsed = timer()
            except Exception as error:  # noqa: BLE001 - reported in the table
                failed[name] = f"{type(error).__name__}: {str(error).strip()[:500]}"
                print(f"  {label} round {round_index} {name}: FAILED {failed[name]}", flush=True)
                continue
            if round_index > 0:
                samples[name].append(elapsed)
            print(f"  {label} round {round_index} {name}: {elapsed:.2f} s", flush=True)
    return samples, failed


def whole_process_comparison(n: int, reps: int) -> Tuple[bool, Dict[str, Optional[float]]]:
    """``raydist run`` from nothing and attached, each against torchrun in the
    same rounds; prints the tables. (False if raydist failed, the two ratios.)"""
    from _common import fmt_ratio, fmt_s, median, print_table, verdict

    rows: List[List[object]] = []
    ratio_rows: List[List[object]] = []
    ok = True

    # 1. No Ray running: every raydist sample starts and stops its own.
    fresh = f"raydist run -n {n} (starts Ray)"
    samples, failed = interleave(
        {fresh: lambda: run_timed(raydist_run_command(n), "raydist run --standalone"), "torchrun": lambda: time_torchrun(n)},
        reps,
        "no Ray running",
        None,
    )
    settings = [("no Ray running", fresh, samples, failed, TARGET_CLI_VS_TORCHRUN)]

    # 2. Attached to a running cluster.
    attached = f"raydist run -n {n} --address"
    env = _ray_auth_env()
    head = RayHead(env)
    try:
        address = head.start()
        print(f"  started ray start --head at {address} (temp dir {head.temp_dir})", flush=True)
        samples2, failed2 = interleave(
            {
                attached: lambda: run_timed(raydist_run_command(n, address), "raydist run --address", env=env),
                "torchrun": lambda: time_torchrun(n),
            },
            reps,
            "attached",
            None,
        )
    except Exception as error:  # noqa: BLE001 - the head itself failed: report, do not abort the rest
        samples2, failed2 = {attached: [], "torchrun": []}, {attached: f"{type(error).__name__}: {error}"}
    finally:
        head.stop()
    settings.append(("attached to ray start --head", attached, samples2, failed2, TARGET_ATTACHED_VS_TORCHRUN))
    ratios: Dict[str, Optional[float]] = {}

    for setting, name, got, why, target in settings:
        for method in (name, "torchrun"):
            values = got.get(method) or []
            if values:
                rows.append([setting, method, fmt_s(median(values)), fmt_s(min(values)), len(values)])
            else:
                rows.append([setting, method, f"unavailable ({why.get(method, 'no samples')})", "", 0])
        rd, tr = got.get(name) or [], got.get("torchrun") or []
        ratio = median(rd) / median(tr) if rd and tr else None
        ratios[setting] = ratio
        ratio_rows.append(
            [
                setting,
                fmt_ratio(median(rd) if rd else None, median(tr) if tr else None),
                f"<= {target:g}x: {verdict(None if ratio is None else ratio <= target)}",
            ]
        )
        ok &= bool(rd)
    print_table(
        f"Whole process, N={n}, script = gloo init + barrier ({reps} timed rounds after a warm-up, interleaved)",
        ["setting", "command", "median", "min", "samples"],
        rows,
    )
    print_table(
        "Whole-process ratio to torchrun measured in the same rounds (medians)",
        ["setting", "raydist run / torchrun", "goal"],
        ratio_rows,
    )
    return ok, ratios


def print_three_ratios(vs_floor: Optional[float], cli_ratios: Dict[str, Optional[float]], n: int = 2) -> None:
    """The issue's three goals, each measured side by side in its own rounds."""
    from _common import print_table, verdict

    def row(what: str, ratio: Optional[float], goal: float) -> List[object]:
        return [
            what,
            "not measured" if ratio is None else f"{ratio:.2f}x",
            f"<= {goal:g}x",
            verdict(None if ratio is None else ratio <= goal),
        ]

    print_table(
        "The three cold-start ratios",
        ["ratio", "measured", "goal", "verdict"],
        [
            row(f"raydist.run() cold / bare-actor floor (N={n})", vs_floor, TARGET_VS_FLOOR),
            row("raydist run -n 2 from nothing / torchrun", cli_ratios.get("no Ray running"), TARGET_CLI_VS_TORCHRUN),
            row("raydist run -n 2 attached / torchrun", cli_ratios.get("attached to ray start --head"), TARGET_ATTACHED_VS_TORCHRUN),
        ],
    )


def make_time_trainer(storage: str) -> Callable[[int], float]:
    """TorchTrainer timing, or an exception saying why it cannot run."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def time_trainer(n: int) -> float:
        start = time.perf_counter()
        TorchTrainer(
            noop_train_fn,
            scaling_config=ScalingConfig(num_workers=n, use_gpu=False),
            run_config=RunConfig(storage_path=storage, name=f"noop-{uuid.uuid4().hex[:8]}"),
        ).fit()
        return time.perf_counter() - start

    return time_trainer


def train_version() -> str:
    try:
        from ray.train.v2._internal.constants import V2_ENABLED_ENV_VAR, is_v2_enabled
    except ImportError:
        return "Ray Train v1 (no v2 in this Ray)"
    set_to = os.environ.get(V2_ENABLED_ENV_VAR)
    how = f"{V2_ENABLED_ENV_VAR}={set_to}" if set_to is not None else f"{V2_ENABLED_ENV_VAR} unset: this Ray's default"
    return f"Ray Train {'v2' if is_v2_enabled() else 'v1'} ({how})"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="timed rounds (after one warm-up round)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4], help="numbers of workers")
    parser.add_argument("--cli-reps", type=int, default=5, help="timed rounds of the whole-process comparison")
    parser.add_argument("--cli-workers", type=int, default=2, help="N of the whole-process comparison")
    parser.add_argument("--quick", action="store_true", help="one timed round (three for the whole-process comparison)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--cli-only", action="store_true", help="only the whole-process comparison")
    only.add_argument("--no-cli", action="store_true", help="skip the whole-process comparison")
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torchrun_worker:
        torchrun_worker()
        return
    if args.quick:
        args.reps = 1
        args.cli_reps = min(args.cli_reps, 3)

    from _common import (
        fmt_ratio,
        fmt_s,
        header,
        init_ray,
        median,
        print_table,
        verdict,
        wait_for_quiet_cpu,
    )

    header("cold start")
    # First, before this process starts a Ray of its own (whose dashboard agent
    # would hold the port a fresh private Ray wants, and whose daemons share the cores).
    cli_ok, cli_ratios = True, {}
    if not args.no_cli:
        cli_ok, cli_ratios = whole_process_comparison(args.cli_workers, args.cli_reps)
    if args.cli_only:
        print_three_ratios(None, cli_ratios)
        if not cli_ok:
            sys.exit(1)
        return

    import ray

    # Ray Train's controller needs a CPU slot of its own next to the N workers.
    init_ray(num_cpus=max(args.sizes) + 4)
    storage = tempfile.mkdtemp(prefix="raydist-bench-train-")
    methods: Dict[str, Callable[[int], float]] = {"raydist": time_raydist, "floor": make_time_floor()}
    unavailable: Dict[str, str] = {}
    try:
        methods["TorchTrainer"] = make_time_trainer(storage)
    except Exception as error:  # noqa: BLE001 - an anchor that cannot run is reported, not fatal
        unavailable["TorchTrainer"] = f"{type(error).__name__}: {error}"
    methods["torchrun"] = time_torchrun

    samples: Dict[tuple, List[float]] = {}
    try:
        for round_index in range(1 + args.reps):
            # Round 0 (smallest N only) warms file caches and Ray's worker pool.
            for n in args.sizes[:1] if round_index == 0 else args.sizes:
                for name, timer in methods.items():
                    if name in unavailable:
                        continue
                    wait_for_quiet_cpu()
                    try:
                        elapsed = timer(n)
                    except Exception as error:  # noqa: BLE001
                        unavailable[name] = f"{type(error).__name__}: {str(error).strip()[:500]}"
                        continue
                    if round_index > 0:
                        samples.setdefault((name, n), []).append(elapsed)
                    print(f"  round {round_index} N={n} {name}: {elapsed:.2f} s", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)

    def med(name: str, n: int) -> Optional[float]:
        values = samples.get((name, n))
        return median(values) if values else None

    rows = []
    for n in args.sizes:
        for name in methods:
            values = samples.get((name, n))
            if values:
                rows.append([n, name, fmt_s(median(values)), fmt_s(min(values)), len(values)])
            else:
                rows.append([n, name, "unavailable", "", 0])
    print_table(
        f"Cold start, whole call, no-op function ({args.reps} timed rounds after a warm-up call)",
        ["N", "method", "median", "min", "samples"],
        rows,
    )

    ratio_rows = []
    for n in args.sizes:
        rd, floor, trainer, torchrun = (med(m, n) for m in ("raydist", "floor", "TorchTrainer", "torchrun"))
        vs_floor = rd / floor if rd and floor else None
        vs_trainer = trainer / rd if rd and trainer else None
        ratio_rows.append(
            [
                n,
                fmt_ratio(rd, floor),
                verdict(None if vs_floor is None else vs_floor <= TARGET_VS_FLOOR),
                fmt_ratio(trainer, rd),
                verdict(None if vs_trainer is None else vs_trainer >= TARGET_VS_TRAINER),
                fmt_ratio(torchrun, rd),
            ]
        )
    print_table(
        "Cold start ratios (medians)",
        ["N", "raydist / floor", f"<= {TARGET_VS_FLOOR}x", "TorchTrainer / raydist", f">= {TARGET_VS_TRAINER:g}x", "torchrun / raydist"],
        ratio_rows,
    )
    print(f"TorchTrainer anchor: {train_version()}")
    first = args.sizes[0]
    rd, floor = med("raydist", first), med("floor", first)
    print_three_ratios(rd / floor if rd and floor else None, cli_ratios, first)
    for name, reason in unavailable.items():
        print(f"{name} unavailable: {reason}")
    if "raydist" in unavailable or not cli_ok:
        sys.exit(1)  # an anchor may be missing; raydist failing is a failure


if __name__ == "__main__":
    main()
