"""A backend defined outside the package (here) runs through ``raydist.run``
(registered in-process) and ``raydist run`` (found as an installed plugin
through the "raydist.backends" entry point): one module and one entry."""

from __future__ import annotations

import datetime
import os
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest
from test_cli import cli_env, explain, ray_tmpdir, raydist  # noqa: F401 - fixtures

from raydist.backends.torch_distributed.worker import TorchDistributedBackend
from raydist.core.backend import BackendEntry, register_backend
from raydist.core.environment import WorldInfo

pytestmark = pytest.mark.timeout(240)

TOKEN_VAR = "TAGGED_TOKEN"


class TaggedBackend(TorchDistributedBackend):
    """torch.distributed over gloo under another name; checks that the
    driver's hooks reached this rank before it joins."""

    def __init__(self, backend: Optional[str] = None, dist_url: Optional[str] = None, timeout: Optional[datetime.timedelta] = None) -> None:
        super().__init__("gloo", dist_url, timeout)

    def init(self, device_type: str) -> WorldInfo:
        if not os.environ.get(TOKEN_VAR, "").startswith("rank-"):
            raise RuntimeError(f"{TOKEN_VAR} was not set by the tagged backend's driver hooks")
        world = super().init("cpu")
        self.name = "tagged"
        return world


class TaggedHooks:
    """The driver's side: a token per rank (as horovod's hooks give each rank its slot)."""

    entry: Any = None
    stopped = 0

    def __init__(self, config: Any) -> None:
        self._config = config

    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        return {"backend": "tagged"}

    def start(self, workers: Sequence[Any]) -> List[Dict[str, str]]:
        return [{TOKEN_VAR: f"rank-{worker.rank}"} for worker in workers]

    def stop(self) -> None:
        TaggedHooks.stopped += 1


ENTRY = BackendEntry(
    name="tagged",
    worker=f"{__name__}:TaggedBackend",
    driver_hooks=f"{__name__}:TaggedHooks",
    reserved_env=frozenset({TOKEN_VAR}),
)


def what_the_rank_sees() -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    import raydist

    total = torch.ones(1)
    dist.all_reduce(total)
    return {"backend": raydist.get_context().backend, "token": os.environ[TOKEN_VAR], "sum": total.item()}


@pytest.mark.usefixtures("ray_local")
def test_a_registered_outside_backend_runs_through_raydist_run() -> None:
    import raydist

    register_backend(ENTRY)
    stopped = TaggedHooks.stopped
    seen = raydist.run(what_the_rank_sees, num_workers=2, backend="tagged")
    assert seen == [{"backend": "tagged", "token": f"rank-{rank}", "sum": 2.0} for rank in range(2)]
    assert TaggedHooks.stopped > stopped  # its driver side was stopped with the group
    with pytest.raises(ValueError, match=TOKEN_VAR):  # the variables it sets are reserved
        raydist.run(what_the_rank_sees, num_workers=2, backend="tagged", env={TOKEN_VAR: "mine"})


SCRIPT = textwrap.dedent(
    """
    import os
    import raydist
    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {os.environ['RANK']}: backend={raydist.get_context().backend} "
          f"token={os.environ['TAGGED_TOKEN']} sum={total.item():g}", flush=True)
    """
)


@pytest.mark.soak  # an installed plugin through the CLI (a registered backend runs in make test)
def test_an_installed_plugin_backend_runs_through_raydist_run_cli(tmp_path: Path, cli_env: Dict[str, str]) -> None:  # noqa: F811 - the imported fixture
    # An installed distribution that declares the backend, as `pip install` would leave it.
    dist_info = tmp_path / "site" / "tagged_backend-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tagged-backend\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[raydist.backends]\ntagged = {__name__}:ENTRY\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(cli_env, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), cli_env.get("PYTHONPATH", "")]))
    result = raydist(["run", "-n", "2", "--backend", "tagged", str(script)], env)
    assert result.returncode == 0, explain(result)
    for rank in range(2):
        assert f"rank {rank}: backend=tagged token=rank-{rank} sum=2" in result.stdout, explain(result)


class BrokenBackend(TorchDistributedBackend):
    """Passes every driver-side check, then fails in each worker's init, as a
    backend the workers' torch lacks would."""

    def init(self, device_type: str) -> WorldInfo:
        raise RuntimeError("the broken backend's library is missing on this worker")


class BrokenHooks(TaggedHooks):
    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        return {"backend": "broken"}

    def start(self, workers: Sequence[Any]) -> List[Dict[str, str]]:
        return [{} for _ in workers]


BROKEN = BackendEntry(name="broken", worker=f"{__name__}:BrokenBackend", driver_hooks=f"{__name__}:BrokenHooks")


@pytest.mark.usefixtures("ray_local")
def test_a_backend_failing_in_the_workers_gives_one_plain_report() -> None:
    import raydist
    from raydist.errors import WorkerGroupError

    register_backend(BROKEN)
    with pytest.raises(WorkerGroupError) as raised:
        raydist.run(what_the_rank_sees, num_workers=2, backend="broken")
    text = str(raised.value)
    # Both ranks in one report (their texts are the same once Ray's per-actor header is gone).
    assert "--- ranks 0-1 " in text, text
    assert text.count("RuntimeError: the broken backend's library is missing on this worker") == 1, text
    assert "\x1b[" not in text and "actor_id=" not in text and "ray::" not in text, text
    assert not [line for line in text.splitlines() if line.strip() and set(line.strip()) <= set("^~| ")], text
