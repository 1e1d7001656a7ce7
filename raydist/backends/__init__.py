"""The communication backends behind ``raydist.core.backend.Backend``: one
class each, Ray-free, chosen once per process by ``init_distributed()``."""
