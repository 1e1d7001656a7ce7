"""The communication backends, one package each, holding everything about it:

- ``__init__``: its registry row (``ENTRY``, a ``BackendEntry`` of strings), so
  the registry can list it without importing torch, horovod or Ray;
- ``worker``: the ``raydist.core.backend.Backend`` subclass each rank builds
  (Ray-free, imports only ``raydist.core``), usable under torchrun or SLURM;
- ``driver``: the hooks the worker group builds on the driver (they may read
  the worker records and config the group hands them, and use Ray).

``raydist.core.backend.BUILTIN_BACKENDS`` names each package's ``ENTRY``.
"""
