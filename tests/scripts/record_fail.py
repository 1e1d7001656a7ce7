"""A torchrun script whose entry point is decorated with torch's @record:
rank 1 raises, so torch writes TORCHELASTIC_ERROR_FILE before the process fails."""

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def load_shard(rank: int) -> None:
    raise ValueError(f"shard {rank} is corrupt (recorded)")


@record
def main() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        load_shard(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
