"""The core (devices, environment, initialize, collectives, compat, the backend
interface) and the backends must import and work where Ray is not installed:
torchrun/SLURM/horovodrun users depend on that.

A subprocess hides Ray with a ``sys.meta_path`` finder (ModuleNotFoundError for
``ray`` and ``ray.*``, exactly what a missing install gives) before importing
raydist, then reports what it saw as JSON on stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from core_launch import LAUNCH_TIMEOUT_S, clean_env

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent(
    """
    import importlib.abc
    import json
    import sys


    class HideRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, HideRay())
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        del sys.modules[name]

    report = {}
    try:
        import ray  # noqa: F401
        report["ray_hidden"] = False
    except ImportError:
        report["ray_hidden"] = True

    import raydist
    import raydist.backends.horovod.worker
    import raydist.backends.torch_distributed.worker
    import raydist.config
    import raydist.core.accelerators
    import raydist.core.backend
    import raydist.core.collectives
    import raydist.core.compat
    import raydist.core.devices
    import raydist.core.environment
    import raydist.core.initialize
    from raydist.core import compat

    report["config"] = raydist.RunConfig(num_workers=2, resources_per_worker={"GPU": 0.5}).num_workers
    info = raydist.init_distributed(device="cpu")
    report["record"] = [info.rank, info.world_size, info.distributed, info.device, info.backend]
    report["broadcast"] = raydist.broadcast_object({"k": [1, 2]})
    report["all_gather"] = raydist.all_gather_object(7)
    report["scatter"] = raydist.scatter_object(["only"])
    raydist.barrier()
    report["compat_world_info"] = list(compat.world_info_from_env())
    report["compat_broadcast"] = compat.broadcast_object(None, "x")
    report["torchrun_env_rank"] = raydist.torchrun_env(
        rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
        master_addr="127.0.0.1", master_port=1, base_env={},
    )["RANK"]
    raydist.shutdown()

    # The Ray-backed names load lazily, so only now does Ray's absence show:
    # raydist.run on access, a WorkerGroup (whose engine runs on any cluster) once it starts on Ray.
    for name, use in (("run", lambda: raydist.run), ("WorkerGroup", lambda: raydist.WorkerGroup(2))):
        try:
            use()
            report[name] = "no error"
        except ImportError as error:
            report[name] = "ImportError: " + str(error)
    try:
        raydist.no_such_name
        report["unknown_name"] = "no error"
    except AttributeError as error:
        report["unknown_name"] = "AttributeError: " + str(error)

    report["ray_modules"] = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
    print("REPORT " + json.dumps(report))
    """
)


def test_core_without_ray() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], env=clean_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(line[len("REPORT ") :])

    assert report["ray_hidden"] is True  # the finder works, so the rest means something
    assert report["record"] == [0, 1, False, "cpu", None]
    assert report["broadcast"] == {"k": [1, 2]}
    assert report["all_gather"] == [7]
    assert report["scatter"] == "only"
    assert report["compat_world_info"] == [0, 0, 1]
    assert report["compat_broadcast"] == "x"
    assert report["torchrun_env_rank"] == "1"
    assert report["config"] == 2
    for name in ("run", "WorkerGroup"):
        assert report[name].startswith("ImportError: "), f"raydist.{name}: {report[name]}"
        assert "ray" in report[name]
    assert report["unknown_name"] == "AttributeError: module 'raydist' has no attribute 'no_such_name'"
    assert report["ray_modules"] == []
