"""raydist against the number of ranks: its own driver cost on a simulated
cluster of up to 4,096 ranks, and a real cold start on a simulated 4-node Ray.

Simulated (``_scale_sim``, no Ray started): raydist's driver on the
in-memory fake cluster, 8 .. 4,096 ranks on 1 .. 512 nodes of 8 slots; each
phase's wall time, driver CPU time and peak memory, and how it grows (the
log-log slope between 512 and 4,096 ranks, and over all sizes).

Real (``_scale_real``): ``ray.cluster_utils.Cluster`` starts 4 raylets on
this machine; for N = 4, 8, 16 workers of half a CPU: start, a warm call, a
state step and a crash's recovery with a spare, each beside its floor in the
same run (bare actors doing the same work; ``torchrun --max-restarts 1`` for
recovery). Every process runs on the same cores, so beyond the core count
this measures the machine as much as raydist.

A log-log plot of time against ranks, one line per phase (the real phases
and their floors with them), goes to ``--plot`` (default scale.png here).

    python benchmarks/scale.py [--sizes 4 8 16] [--quick] [--json]
    python benchmarks/scale.py --sim-only [--sim-reps 3] [--json] [--plot PATH]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

DEFAULT_PLOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.png")

Series = Mapping[str, Sequence[float]]  # "ranks" / "workers", "seconds", "floor_seconds"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16], help="real: workers")
    parser.add_argument("--quick", action="store_true", help="real: N = 4; simulated: two rounds, 5 calls")
    parser.add_argument("--sim-only", action="store_true", help="only the simulated part (no Ray started)")
    parser.add_argument("--no-sim", action="store_true", help="only the real part")
    parser.add_argument("--sim-reps", type=int, default=3, help="simulated: timed rounds (medians)")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help="where the plot goes (PNG); '' for none")
    parser.add_argument("--json", action="store_true", help="print every figure as one JSON object, as the last line")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = [4]
        args.sim_reps = 2

    from _common import header

    header("scale")
    simulated: Dict[str, Any] = {}
    if not args.no_sim:
        simulated = run_simulation(args.sim_reps, calls=5 if args.quick else 9)
    real: Dict[str, Dict[str, List[float]]] = {}
    if not args.sim_only:
        real = run_real(args.sizes)
    plotted = plot(simulated.get("simulated", {}), args.plot, real) if args.plot else None
    if plotted:
        print(f"  plot: {plotted}", flush=True)
    if args.json:
        print(json.dumps({**simulated, "real": real, "plot": plotted}))


def run_simulation(reps: int, calls: int) -> Dict[str, Any]:
    """raydist's driver on the fake cluster: its tables printed, its figures returned (``_scale_sim.as_json``)."""
    from _common import print_table
    from _scale_sim import as_json, simulate, tables, targets

    result = simulate(reps=reps, calls=calls)
    for title, columns, rows in tables(result):
        print_table(title, columns, rows)
    print_table("Scale targets (simulated)", ["target", "measured", "result"], targets(result))
    print(f"  simulation: {result.wall_s:.1f} s", flush=True)
    return as_json(result)


def run_real(sizes: Sequence[int]) -> Dict[str, Dict[str, List[float]]]:
    """Start, a warm call, a state step and a crash's recovery with a spare on a
    4-node Ray on this machine, each beside its floor (``_scale_real``); the
    table printed, the series returned."""
    from _common import fmt_ms, fmt_ratio, fmt_s, print_table
    from _scale_real import CPUS_PER_NODE, NODES, real_curve

    curve = real_curve(list(sizes), log=lambda line: print(line, flush=True))
    rows = []
    for phase, series in curve.items():
        for n, seconds, floor in zip(series["workers"], series["seconds"], series["floor_seconds"]):
            show = fmt_s if max(seconds, floor) >= 1 else fmt_ms
            rows.append([phase, n, show(seconds), show(floor), fmt_ratio(seconds, floor)])
    print_table(
        f"raydist on a simulated {NODES}-node Ray ({CPUS_PER_NODE} CPUs each, half a CPU a worker; all share this machine's cores)",
        ["phase", "workers", "raydist", "floor", "raydist / floor"],
        rows,
    )
    return curve


def plot(simulated: Mapping[str, Series], path: str, real: Optional[Mapping[str, Series]] = None) -> str:
    """Time against ranks, log-log: a line per simulated phase (``{"ranks", "seconds"}``),
    and for each real phase (``{"workers", "seconds", "floor_seconds"}``) its
    points and their floor; a dotted line of slope 1 for reference. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, 6.5))
    colours = plt.get_cmap("tab20").colors
    markers = "osD^v<>phX*"
    xs: List[float] = []
    for i, (phase, series) in enumerate(simulated.items()):
        axes.loglog(
            series["ranks"], series["seconds"], marker=markers[i % len(markers)], color=colours[(2 * i) % 20], label=f"{phase} (simulated)"
        )
        xs.extend(series["ranks"])
    dark = ("black", "saddlebrown", "darkgreen", "navy", "purple", "darkred")
    for i, (phase, series) in enumerate((real or {}).items()):
        colour = dark[i % len(dark)]
        axes.loglog(series["workers"], series["seconds"], marker="s", linewidth=2, color=colour, label=f"{phase} (real Ray)")
        if series.get("floor_seconds"):
            axes.loglog(
                series["workers"], series["floor_seconds"], marker="x", linestyle="--", color=colour, label=f"{phase} floor (real Ray)"
            )
        xs.extend(series["workers"])
    if xs:
        low, high = min(xs), max(xs)
        ys = [line.get_ydata() for line in axes.get_lines()]
        anchor = min(min(y) for y in ys) if ys else 1e-4
        axes.loglog([low, high], [anchor, anchor * high / low], linestyle=":", color="grey", label="linear (slope 1)")
    axes.set_xlabel("ranks (workers)")
    axes.set_ylabel("seconds")
    axes.set_title("raydist's cost against the number of ranks")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


if __name__ == "__main__":
    main()
