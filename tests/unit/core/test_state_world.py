"""Per-rank training state loads only into a world of the size that saved it;
shared state loads into any (``raydist.core.state.check_world``)."""

from __future__ import annotations

import pytest

from raydist.core.state import StateSizeError, check_world
from raydist.core.state_files import SnapshotMeta


def test_per_rank_state_refuses_a_world_of_another_size_and_says_what_to_do() -> None:
    meta = SnapshotMeta(step=7, world_size=4, shared=("model",), own=("rng",))
    check_world(meta, 4)
    with pytest.raises(StateSizeError, match=r"step 7 was saved by 4 ranks with per-rank state \(rng\); this world has 1 ranks") as refused:
        check_world(meta, 1)
    assert "save_state(..., shared=[...])" in str(refused.value)


@pytest.mark.parametrize("world_size", [1, 2, 8])
def test_shared_state_loads_into_any_world_size(world_size: int) -> None:
    check_world(SnapshotMeta(step=3, world_size=4, shared=("model", "optimizer"), own=()), world_size)
