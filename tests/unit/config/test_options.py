"""RunConfig: every option checked once, before Ray is touched, with the
option's name in the message. (The documentation's option list is generated
from the same records: tests/unit/project/test_docs.py.)
The same bad inputs through ``raydist.run`` on a live Ray: tests/live/test_config.py (the
table: tests/config_cases.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict

import pytest
from config_cases import BAD_CALLS, BAD_OPTIONS

from raydist.config import OPTION_NAMES, RunConfig, make_config
from raydist.pool.driver.call_check import check_call


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
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_workers = 3  # type: ignore[misc]
    # replace() checks again.
    with pytest.raises(ValueError, match="num_workers"):
        config.replace(num_workers=0)
    # A config and keyword options combine; keywords win.
    assert make_config(RunConfig(num_workers=2, timeout=5), {"timeout": 7.0}) == RunConfig(num_workers=2, timeout=7.0)


def test_cli_flags_map_to_options() -> None:
    from raydist.cli import build_parser
    from raydist.config import cli_options

    assert {option.name for option, _ in cli_options()} <= set(OPTION_NAMES)
    _, run_parser = build_parser()
    flags = {option for action in run_parser._actions for option in action.option_strings}
    assert {flag.flag for _, flag in cli_options()} <= flags
