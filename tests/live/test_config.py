"""RunConfig: every option checked once, before Ray is touched, with the
option's name in the message; and the README's option list kept in step."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from conftest import live_placement_groups, raydist_actors_ever_created

import raydist
from raydist.config import OPTION_NAMES, RunConfig, make_config
from raydist.pool.driver.call_check import check_call

REPO = Path(__file__).resolve().parents[2]


def noop() -> None:
    return None


def generator_fn() -> Iterator[int]:
    yield 1


async def async_fn() -> None:
    return None


BAD_OPTIONS = [
    # (options, exception type, text the message must contain)
    ({"num_workers": 0}, ValueError, "num_workers"),
    ({"num_workers": -1}, ValueError, "num_workers"),
    ({"num_workers": True}, TypeError, "num_workers"),
    ({"num_workers": 2.0}, TypeError, "num_workers"),
    ({"num_workers": "2"}, TypeError, "num_workers"),
    ({"accelerator": "tpu"}, ValueError, "auto, gpu, xpu, npu, hpu, cpu"),
    ({"placement_strategy": "RANDOM"}, ValueError, "STRICT_SPREAD"),
    ({"env": {"WORLD_SIZE": "3"}}, ValueError, "WORLD_SIZE"),
    ({"env": {"RANK": "0"}}, ValueError, "RANK"),
    ({"env": {"MASTER_PORT": "29500"}}, ValueError, "MASTER_PORT"),
    ({"env": {"TORCHELASTIC_RUN_ID": "x"}}, ValueError, "TORCHELASTIC_RUN_ID"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ValueError, "CUDA_VISIBLE_DEVICES"),
    ({"env": {"RAYDIST_DEVICE_INDEX": "1"}}, ValueError, "RAYDIST_DEVICE_INDEX"),
    ({"num_workers": (3, 2)}, ValueError, "min <= max"),
    ({"num_workers": (0, 2)}, ValueError, "num_workers min"),
    ({"num_workers": (1, 2, 3)}, ValueError, "(min, max)"),
    ({"restart_to_grow": True}, ValueError, "restart_to_grow needs an elastic size"),
    ({"preemption_signal": "SIGNOPE"}, ValueError, "preemption_signal"),
    ({"env": {"A": 1}}, TypeError, "env['A']"),
    ({"env": ["A=1"]}, TypeError, "env"),
    ({"env": {"A=B": "1"}}, ValueError, "env key"),
    ({"resources_per_worker": [("CPU", 1)]}, TypeError, "resources_per_worker"),
    ({"resources_per_worker": {"CPU": float("nan")}}, ValueError, "resources_per_worker['CPU']"),
    ({"resources_per_worker": {"CPU": math.inf}}, ValueError, "resources_per_worker['CPU']"),
    ({"resources_per_worker": {"CPU": -1}}, ValueError, "resources_per_worker['CPU']"),
    ({"resources_per_worker": {"CPU": "2"}}, TypeError, "resources_per_worker['CPU']"),
    ({"resources_per_worker": {"CPU": True}}, TypeError, "resources_per_worker['CPU']"),
    ({"resources_per_worker": {"GPU": 1.5}}, ValueError, "whole number"),
    ({"resources_per_worker": {"gpu": 1}}, ValueError, "spelled 'GPU'"),
    ({"resources_per_worker": {"CPU": 0.00001}}, ValueError, "steps of"),
    ({"resources_per_worker": {"CPU": 0}, "accelerator": "cpu"}, ValueError, "no resources"),
    ({"resources_per_worker": {"GPU": 1}, "accelerator": "cpu"}, ValueError, "accelerator='cpu'"),
    ({"resources_per_worker": {"GPU": 0}, "accelerator": "gpu"}, ValueError, "GPU to 0"),
    ({"timeout": -1}, ValueError, "timeout"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"timeout": "5"}, TypeError, "timeout"),
    ({"timeout": math.inf}, ValueError, "timeout"),
    ({"startup_timeout": -1}, ValueError, "startup_timeout"),
    ({"startup_timeout": None}, TypeError, "startup_timeout"),
    ({"max_restarts": -1}, ValueError, "max_restarts"),
    ({"max_restarts": "1"}, TypeError, "max_restarts"),
    ({"retry_on_exception": 1}, TypeError, "retry_on_exception"),
    ({"init_process_group": "yes"}, TypeError, "init_process_group"),
    ({"backend": 3}, TypeError, "backend"),
    ({"backend": "gloo", "init_process_group": False}, ValueError, "backend"),
    ({"address": "http://127.0.0.1:8265"}, ValueError, "ray job submit"),
    ({"address": ""}, TypeError, "address"),
    ({"object_store_threshold": -1}, ValueError, "object_store_threshold"),
    ({"num_worker": 2}, TypeError, "num_worker"),
]

BAD_CALLS = [
    # (fn, args, kwargs, exception type, text)
    (noop, 5, None, TypeError, "args"),
    (noop, "ab", None, TypeError, "args"),
    (noop, {"a": 1}, None, TypeError, "args"),
    (noop, (), [("a", 1)], TypeError, "kwargs"),
    (noop, (), {1: "a"}, TypeError, "kwargs"),
    (generator_fn, (), None, TypeError, "generator"),
    (async_fn, (), None, TypeError, "async"),
    ("not a function", (), None, TypeError, "callable"),
]


@pytest.mark.parametrize("options, kind, text", BAD_OPTIONS)
def test_bad_option_is_named(options: Dict[str, Any], kind: type, text: str) -> None:
    with pytest.raises(kind) as caught:
        make_config(None, options)
    assert text in str(caught.value)


@pytest.mark.parametrize("fn, args, kwargs, kind, text", BAD_CALLS)
def test_bad_call_is_named(fn: Any, args: Any, kwargs: Any, kind: type, text: str) -> None:
    with pytest.raises(kind, match=re.escape(text)):
        check_call(fn, args, kwargs)


def test_defaults_and_normalised_values() -> None:
    config = RunConfig(accelerator="GPU", placement_strategy="spread", backend=" Gloo ", resources_per_worker={"GPU": 2})
    assert (config.accelerator, config.placement_strategy, config.backend) == ("gpu", "SPREAD", "gloo")
    assert config.resources_per_worker == {"GPU": 2.0}
    assert RunConfig().env == {} and RunConfig().resources_per_worker == {}
    assert RunConfig(backend="horovod").horovod
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_workers = 3  # type: ignore[misc]
    # replace() checks again.
    with pytest.raises(ValueError, match="num_workers"):
        config.replace(num_workers=0)
    # A config and keyword options combine; keywords win.
    assert make_config(RunConfig(num_workers=2, timeout=5), {"timeout": 7.0}) == RunConfig(num_workers=2, timeout=7.0)


def test_readme_lists_every_option_with_its_default() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("#### Options", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", section, flags=re.M)
    assert [name for name, _ in rows] == list(OPTION_NAMES)
    for field in dataclasses.fields(RunConfig):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
        assert dict(rows)[field.name] == repr(default), field.name


def test_cli_flags_map_to_options() -> None:
    from raydist.cli import build_parser
    from raydist.config import cli_options

    assert {option.name for option, _ in cli_options()} <= set(OPTION_NAMES)
    _, run_parser = build_parser()
    flags = {option for action in run_parser._actions for option in action.option_strings}
    assert {flag.flag for _, flag in cli_options()} <= flags


# -- through the public API, on a live Ray: nothing starts ------------------


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_local")
def test_bad_input_through_run_and_worker_group_starts_no_actor() -> None:
    before = raydist_actors_ever_created()
    for options, kind, text in BAD_OPTIONS:
        with pytest.raises(kind, match=re.escape(text)):
            raydist.run(noop, **options)
        with pytest.raises(kind, match=re.escape(text)):
            raydist.WorkerGroup(**options)
    for fn, args, kwargs, kind, text in BAD_CALLS:
        with pytest.raises(kind, match=re.escape(text)):
            raydist.run(fn, num_workers=1, args=args, kwargs=kwargs)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"args\[1\]"):
        raydist.run(lambda a, b: None, num_workers=1, args=(1, lock))
    # Known only once the cluster is: CPU workers asking for no resources at all.
    with pytest.raises(ValueError, match="no resources"):
        raydist.run(noop, num_workers=1, resources_per_worker={"CPU": 0})
    assert raydist_actors_ever_created() == before
    assert live_placement_groups() == []
