"""Bad options and calls through the public API on a live Ray: each is
refused before any actor or placement group starts (the pure checks of the
same inputs: tests/unit/config/test_options.py; the table:
tests/config_cases.py)."""

from __future__ import annotations

import re
import threading

import pytest
from config_cases import BAD_CALLS, BAD_OPTIONS, noop
from conftest import live_placement_groups, raydist_actors_ever_created

import raydist

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
