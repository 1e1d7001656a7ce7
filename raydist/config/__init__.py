"""Every option of ``raydist.run``, ``WorkerGroup`` and ``raydist run``.

``RunConfig`` is frozen and Ray-free: each option is one ``Option`` record
(default, check, CLI flag and help, meaning) in the module of its family
(``placement``, ``process``, ``lifecycle``, ``logs``); ``options`` declares
the fields and checks options together; ``flags`` holds the CLI's flag record
and converters, ``values`` the checks every family shares. Every check runs
when a config is built, before Ray is touched, so bad input fails at once
with the option's name. The CLI builds one from flags, ``run`` and
``WorkerGroup`` from keywords; the worker group only reads it.
"""

from raydist.config.flags import CliFlag, parse_int
from raydist.config.lifecycle import CLI_RESTART_MODE, RESTART_MODES
from raydist.config.logs import STD_ALL, STD_ERR, STD_NONE, STD_OUT, StdSpec, parse_local_ranks, parse_std
from raydist.config.option import Option, option_default
from raydist.config.options import OPTION_NAMES, RunConfig, cli_options, make_config
from raydist.config.placement import ELASTIC_SIZE, NODE_ID_LABEL, PLACEMENT_STRATEGIES
from raydist.config.process import DEFAULT_OBJECT_STORE_THRESHOLD, NUMA_BINDING_MODES, reserved_env_vars
from raydist.config.values import check_seconds

__all__ = [
    "CLI_RESTART_MODE",
    "DEFAULT_OBJECT_STORE_THRESHOLD",
    "ELASTIC_SIZE",
    "NODE_ID_LABEL",
    "NUMA_BINDING_MODES",
    "OPTION_NAMES",
    "PLACEMENT_STRATEGIES",
    "RESTART_MODES",
    "STD_ALL",
    "STD_ERR",
    "STD_NONE",
    "STD_OUT",
    "CliFlag",
    "Option",
    "RunConfig",
    "StdSpec",
    "check_seconds",
    "cli_options",
    "make_config",
    "option_default",
    "parse_int",
    "parse_local_ranks",
    "parse_std",
    "reserved_env_vars",
]
