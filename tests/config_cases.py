"""Bad options and bad calls, each with the exception and the words its
message must contain: checked pure in tests/unit/config/test_options.py and
through the public API on a live Ray in tests/live/test_config.py."""

from __future__ import annotations

import math
from typing import Iterator


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
