"""torch.distributed (gloo, nccl, hccl, xccl, mpi, ...) as a raydist backend:
the worker's class in ``worker``, the (empty) driver side in ``driver``."""

from raydist.core.backend import TORCH_BACKEND, BackendEntry

ENTRY = BackendEntry(
    name=TORCH_BACKEND,
    worker="raydist.backends.torch_distributed.worker:TorchDistributedBackend",
    driver_hooks="raydist.backends.torch_distributed.driver:TorchDistributedHooks",
)
