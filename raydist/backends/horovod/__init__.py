"""horovod as a raydist backend: the worker's class in ``worker``, the
driver's rendezvous server in ``driver``."""

from raydist.core.backend import BackendEntry

INSTALL_HINT = (
    "horovod is not installed: install it with scripts/install-horovod.sh "
    "(horovod 0.28.1 needs a C++17 patch to build against current torch), "
    "or `pip install 'raydist[horovod]'` where a compatible wheel exists"
)

ENTRY = BackendEntry(
    name="horovod",
    worker="raydist.backends.horovod.worker:HorovodBackend",
    driver_hooks="raydist.backends.horovod.driver:HorovodHooks",
    reserved_env_prefixes=("HOROVOD_GLOO_RENDEZVOUS_",),
    requires="horovod.torch",
    install_hint=INSTALL_HINT,
)
