"""The communication backends behind ``raydist.core.backend.Backend``: one
class each, Ray-free, built by ``init_distributed()`` from its registry entry
(``raydist.core.backend.BUILTIN_BACKENDS``). Modules here import only
``raydist.core``."""
