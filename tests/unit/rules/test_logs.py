"""torchrun's per-rank log rules, checked against torch's own implementation
(``Std.from_str``, ``DefaultLogsSpecs.reify``) without Ray."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, Optional, Set

import pytest
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

from raydist.config import RunConfig, parse_local_ranks, parse_std
from raydist.pool.driver.log_files import RankLog, RunLogs
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.logs import PREFIX_TEMPLATE_VAR, console_prefix, line_prefix, rank_route

REPO = Path(__file__).resolve().parents[3]


CODES = ["0", "1", "2", "3", "0:1", "1:2", "0:3,1:1", "0:2,2:3"]


def torch_codes(value: Any, nprocs: int) -> Dict[int, int]:
    parsed = Std.from_str(value)
    return {rank: int(parsed if isinstance(parsed, Std) else parsed.get(rank, Std.NONE)) for rank in range(nprocs)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", CODES)
def test_stream_codes_parse_as_torchrun_parses_them(value: str) -> None:
    ours = parse_std("redirects", value)
    for rank in range(3):
        assert (ours if isinstance(ours, int) else ours.get(rank, 0)) == torch_codes(value, 3)[rank]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["4", "-1", "0:4", "a", "0:1,", "1,2", ""])
def test_stream_codes_torchrun_refuses_are_refused(value: str) -> None:
    with pytest.raises(ValueError):
        Std.from_str(value)
    with pytest.raises(ValueError, match="tee"):
        RunConfig(tee=value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "options, error, text",
    [
        ({"redirects": True}, TypeError, "redirects"),
        ({"redirects": 4}, ValueError, "redirects"),
        ({"redirects": {0: 5}}, ValueError, "redirects[0]"),
        ({"redirects": {-1: 1}}, ValueError, "redirects key"),
        ({"local_ranks_filter": "0,x"}, ValueError, "local_ranks_filter"),
        ({"local_ranks_filter": [-1]}, ValueError, "local_ranks_filter"),
        ({"local_ranks_filter": 0.5}, TypeError, "local_ranks_filter"),
        ({"log_dir": 3}, TypeError, "log_dir"),
        ({"log_line_prefix_template": 3}, TypeError, "log_line_prefix_template"),
        ({"log_dir": str(REPO / "README.md")}, ValueError, "not a directory"),
    ],
)
def test_bad_log_options_are_named(options: Dict[str, Any], error: type, text: str) -> None:
    with pytest.raises(error) as raised:
        RunConfig(**options)
    assert text in str(raised.value)


@pytest.mark.timeout(30)
def test_option_values_are_normalised() -> None:
    config = RunConfig(redirects="0:1,1:2", tee=3, local_ranks_filter="1,0", log_dir=Path("logs"))
    assert (config.redirects, config.tee, config.local_ranks_filter, config.log_dir) == ({0: 1, 1: 2}, 3, (0, 1), "logs")
    assert parse_local_ranks("local_ranks_filter", "") is None  # torchrun's default: no filter


@pytest.mark.timeout(60)
@pytest.mark.parametrize("redirects", ["0", "3", "0:1,1:2"])
@pytest.mark.parametrize("tee", ["0", "2", "1:3"])
@pytest.mark.parametrize("shown", [None, {0}, {1, 2}])
def test_routes_match_torchrun(redirects: str, tee: str, shown: Optional[Set[int]], tmp_path: Path) -> None:
    """Which stream goes to which file and which reaches the console, rank by
    rank, as torch's DefaultLogsSpecs decides it."""
    nprocs = 3
    envs = {rank: {"TORCHELASTIC_RUN_ID": "run", "TORCHELASTIC_RESTART_COUNT": "0"} for rank in range(nprocs)}
    torch_dest = DefaultLogsSpecs(str(tmp_path), Std.from_str(redirects), Std.from_str(tee), shown).reify(envs)
    attempt_dir = os.path.dirname(os.path.dirname(torch_dest.error_files[0]))
    config = RunConfig(redirects=redirects, tee=tee, local_ranks_filter=shown)
    for rank in range(nprocs):
        route = rank_route(config, rank, rank, os.path.join(attempt_dir, str(rank)), None)
        for stream, files, tees in (
            (route.stdout, torch_dest.stdouts, torch_dest.tee_stdouts),
            (route.stderr, torch_dest.stderrs, torch_dest.tee_stderrs),
        ):
            torch_file = files[rank] if files[rank] not in ("", os.devnull) else None
            assert stream.file == torch_file, (rank, stream)
            assert stream.console == (files[rank] == "" or rank in tees), (rank, stream)


@pytest.mark.timeout(30)
def test_prefix_template_and_default_prefix() -> None:
    config = RunConfig()
    route = rank_route(config, 5, 1, None, "[${role_name}${rank}/${local_rank}|${other}]:")
    assert route.prefix == "[default5/1|${other}]:"  # torchrun's safe_substitute keeps unknown names
    plain = rank_route(config, 5, 1, None, None)
    assert console_prefix(plain, 42, None, colour=False) == "(rank=5 pid=42) "
    assert console_prefix(plain, 42, "10.0.0.2", colour=False) == "(rank=5 pid=42, ip=10.0.0.2) "
    assert "\x1b[" in console_prefix(plain, 42, None, colour=True)
    assert console_prefix(route, 42, None, colour=True) == route.prefix  # as torchrun: no colour
    assert line_prefix(None, 0, 0) is None


def worker(rank: int, local_rank: int) -> WorkerInfo:
    return WorkerInfo(
        rank=rank,
        world_size=2,
        local_rank=local_rank,
        local_world_size=1,
        node_rank=rank,
        num_nodes=2,
        node_id=f"node{rank}",
        node_ip=f"10.0.0.{rank}",
        pid=100 + rank,
        device_ids=(),
        visible_device_ids=(),
        device_index=None,
        actor_index=rank,
    )


@pytest.mark.timeout(30)
def test_run_logs_layout_across_attempts(tmp_path: Path) -> None:
    logs = RunLogs(RunConfig(log_dir=str(tmp_path / "logs"), redirects="0:1"))
    workers = [worker(0, 0), worker(1, 0)]  # two nodes: local rank 0 twice, directories by rank
    routes = logs.attempt(0, workers)
    assert logs.run_dir is not None and os.path.basename(logs.run_dir).startswith(f"{logs.run_id}_")
    files = [RankLog(route) for route in routes]
    files[1].write(["a", "b"], is_err=False)
    files[1].write(["ignored: stderr is not redirected"], is_err=True)
    for log in files:
        log.close()
    files[1].write(["after close"], is_err=False)  # a late line is dropped, not an error
    run_dir = Path(logs.run_dir)
    assert (run_dir / "attempt_0" / "1" / "stdout.log").read_text() == "a\nb\n"
    assert (run_dir / "attempt_0" / "0" / "stdout.log").read_text() == ""
    assert not (run_dir / "attempt_0" / "0" / "stderr.log").exists()
    logs.attempt(1, workers)
    assert sorted(p.name for p in run_dir.iterdir()) == ["attempt_0", "attempt_1"]
    (run_dir / "attempt_1" / "0" / "stale.log").write_text("from before")
    logs.attempt(1, workers)  # an attempt directory is emptied, as torchrun's reify does
    assert list((run_dir / "attempt_1" / "0").iterdir()) == []
    assert RunLogs(RunConfig(local_ranks_filter=0)).attempt(0, workers)[0].stdout.file is None  # no files asked


@pytest.mark.timeout(30)
def test_the_template_flag_wins_over_the_variable_and_names_each_ranks_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PREFIX_TEMPLATE_VAR, "[${rank}]:")
    assert RunLogs(RunConfig()).template == "[${rank}]:"  # the variable, as torchrun reads it
    logs = RunLogs(RunConfig(log_line_prefix_template="${hostname}:${rank}: "))
    hosts = [dataclasses.replace(worker(rank, 0), hostname=f"r12i0n{rank}") for rank in (0, 1)]
    # As torch 2.15's agent expands it: the short host name of the rank's node.
    assert [route.prefix for route in logs.attempt(0, hosts)] == ["r12i0n0:0: ", "r12i0n1:1: "]
    assert line_prefix("[${hostname}]", 3, 1) == "[]"  # a host name nobody reported: empty, as torch's without one
