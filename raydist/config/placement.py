"""The options that say where the workers run: how many, on which nodes, with
which resources, on which cluster; each with its checks."""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, Dict, List, Mapping, Tuple, Union

from raydist.config.flags import flag, parse_resources
from raydist.config.option import Option
from raydist.config.values import check_int, choice, empty_if_none, is_number, optional, type_name
from raydist.core.accelerators import ACCELERATOR_CHOICES, DEVICE_RESOURCES, auto_help, kinds_help

PLACEMENT_STRATEGIES: Tuple[str, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
DEFAULT_PLACEMENT_STRATEGY = "PACK"  # where placement_strategy is None and num_nodes is not set
# How the API names an elastic size; the CLI says --nnodes MIN:MAX.
ELASTIC_SIZE = "num_workers=(min, max) or num_nodes=(min, max)"

# Ray's built-in resources, spelled as Ray spells them ("gpu" is a typo, not a custom resource).
_RAY_RESOURCES = ("CPU", "memory", "object_store_memory", *DEVICE_RESOURCES)
# Ray names placement-group resources "<name>_group_<index>_<pg id>" and "bundle_group_<pg id>".
_PLACEMENT_GROUP_RESOURCE = re.compile(r"^bundle$|^bundle_group_|_group_(\d+_)?[0-9a-f]{16,}$")
# Ray counts resources in units of 1/10000.
_RESOURCE_PRECISION = 1e-4

# Ray's label syntax (Kubernetes'): a name, an optional DNS-subdomain prefix for keys.
_LABEL_NAME = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_LABEL_KEY = re.compile(rf"^({_LABEL_NAME}(\.{_LABEL_NAME})*/)?{_LABEL_NAME}$")
# A selector value in Ray's forms: "v", "!v", "in(v1,v2)", "!in(v1,v2)".
_LABEL_CONDITION = re.compile(rf"^!?(in\(\s*{_LABEL_NAME}(\s*,\s*{_LABEL_NAME})*\s*\)|{_LABEL_NAME})$")
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node
_NODE_ID_PREFIX = re.compile(r"^[0-9a-fA-F]{8,}$")


def check_size(name: str, value: Any) -> Union[int, Tuple[int, int], None]:
    """num_workers / num_nodes: N, or (min, max) for an elastic size; (n, n) is n."""
    if not isinstance(value, (tuple, list)):
        return None if value is None else check_int(name, value, 1)
    if len(value) != 2:
        raise ValueError(f"{name} as a range is (min, max), got {value!r}")
    check_int(f"{name} min", value[0], 1)
    check_int(f"{name} max", value[1], 1)
    if value[1] < value[0]:
        raise ValueError(f"{name}=(min, max) needs min <= max, got {tuple(value)!r}")
    return value[0] if value[0] == value[1] else (value[0], value[1])


def check_resources(name: str, resources: Any) -> Dict[str, float]:
    """``resources_per_worker`` as a plain dict of floats; TypeError/ValueError naming the entry."""
    if not isinstance(resources, Mapping):
        raise TypeError(f'{name} must be a mapping such as {{"CPU": 2, "GPU": 1}}, not {type_name(resources)}')
    checked: Dict[str, float] = {}
    for key, amount in resources.items():
        where = f"{name}[{key!r}]"
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name} keys must be non-empty resource names, got {key!r}")
        for known in _RAY_RESOURCES:
            if key != known and key.lower() == known.lower():
                raise ValueError(f"{where}: Ray's resource is spelled {known!r}")
        if key == "object_store_memory":
            raise ValueError(
                f"{where}: Ray does not reserve object store memory per worker (deprecated in Ray, and "
                "its raylet fails on it inside a placement group); leave it out: objects spill to disk "
                "when the store is full. 'memory' (heap bytes per worker) is honoured"
            )
        if _PLACEMENT_GROUP_RESOURCE.search(key):
            raise ValueError(f"{where}: names of this form are Ray's placement-group resources")
        checked[key] = _check_amount(where, key, amount)
    return checked


def _check_amount(where: str, key: str, amount: Any) -> float:
    if not is_number(amount):
        raise TypeError(f"{where} must be a number, not {type_name(amount)} {amount!r}")
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"{where} must be a finite number >= 0, got {amount!r}")
    if amount and amount < _RESOURCE_PRECISION:
        raise ValueError(f"{where}={amount!r}: Ray counts resources in steps of {_RESOURCE_PRECISION:g}")
    if key in DEVICE_RESOURCES and amount > 1 and not float(amount).is_integer():
        raise ValueError(
            f"{where}={amount!r}: a worker either shares one device (an amount below 1) or holds whole devices (a whole number)"
        )
    return float(amount)


def split_outside_parentheses(text: str) -> List[str]:
    """``"a=in(x,y),b=z"`` -> ``["a=in(x,y)", "b=z"]``: commas inside ``in(...)`` stay."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [part.strip() for part in parts + [current] if part.strip()]


def check_label_selector(name: str, value: Any) -> Dict[str, str]:
    """Ray's label selector: ``{"zone": "a", "pool": "!in(spot,preemptible)"}``
    or the same as ``"zone=a,pool=!in(spot,preemptible)"``."""
    if isinstance(value, str):
        pairs = [part.partition("=") for part in split_outside_parentheses(value)]
        bad = ["".join(pair) for pair in pairs if not pair[1] or not pair[0].strip()]
        if bad:
            raise ValueError(f"{name} entry {bad[0]!r} is not KEY=VALUE (e.g. zone=a, zone=!a, zone=in(a,b))")
        value = {key.strip(): condition.strip() for key, _, condition in pairs}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping such as {{'zone': 'a'}} or 'zone=a', not {type_name(value)}")
    for key, condition in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise ValueError(f"{name} key {key!r} is not a Ray label key (such as 'zone' or 'example.com/pool')")
        if not isinstance(condition, str) or not _LABEL_CONDITION.match(condition.strip()):
            raise ValueError(f"{name}[{key!r}]={condition!r} is not one of Ray's forms: VALUE, !VALUE, in(V1,V2,...), !in(V1,V2,...)")
    # Ray's placement takes "in(a,b)" but never places a bundle whose selector reads "in(a, b)".
    return {key: re.sub(r"\s+", "", condition) for key, condition in value.items()}


def check_exclude_nodes(name: str, value: Any) -> Tuple[str, ...]:
    """Nodes to leave out: Ray node ids (or their first 8+ characters) or IPs;
    a comma-separated string or a collection."""
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be node ids or IPs such as ['10.0.0.5'], not {type_name(value)}")
    checked = []
    for item in items:
        if not isinstance(item, str) or not (_NODE_ID_PREFIX.match(item) or _is_ip(item)):
            raise ValueError(f"{name} entry {item!r} is neither a Ray node id (at least its first 8 characters) nor an IP address")
        checked.append(item.lower() if _NODE_ID_PREFIX.match(item) else item)
    return tuple(dict.fromkeys(checked))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_accelerator_type(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(char.isspace() for char in value.strip()):
        raise ValueError(f"{name} must be a type name such as 'H100', got {value!r}")
    return value.strip()


def check_address(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a Ray address such as 'HOST:6379', not {value!r}")
    if value.startswith(("http://", "https://")):
        raise ValueError(
            f"{name} {value!r} is a dashboard / job API URL; give the cluster's "
            "GCS endpoint (HOST:6379), or submit the run as a job: "
            f"ray job submit --address {value} -- raydist run ..."
        )
    return value


# -- the options ------------------------------------------------------------

NUM_WORKERS = Option(
    None,
    check=check_size,
    doc="ranks to start; None means one per device of the chosen kind in the cluster, or one per "
    "CPU slot when there are none. ``(min, max)`` makes the group elastic: it starts with as many "
    "workers as fit (up to max) once min fit, and after a node loss or preemption restarts with "
    "the workers that fit then.",
    flag=flag("--nproc-per-node", help="set by -n/--nproc-per-node", generated=False),
)
NUM_NODES = Option(
    None,
    check=check_size,
    doc="with ``workers_per_node``, torchrun's layout: exactly ``workers_per_node`` ranks on each of "
    "``num_nodes`` distinct nodes (node g holds ranks g*P ... g*P+P-1; every rank sees "
    "LOCAL_WORLD_SIZE=P); one placement-group bundle per node, STRICT_SPREAD "
    "(``placement_strategy`` does not apply). ``(min, max)``: elastic in whole nodes. Excludes "
    "``num_workers``.",
    flag=flag("--nnodes", help="set by --nnodes", generated=False),
)
WORKERS_PER_NODE = Option(
    None,
    check=optional(lambda name, value: check_int(name, value, 1)),
    doc="the ranks on each node under ``num_nodes``.",
    flag=flag("--nproc-per-node", help="set by -n/--nproc-per-node with --nnodes", generated=False),
)
ACCELERATOR = Option(
    "auto",
    check=choice(ACCELERATOR_CHOICES),
    doc='"auto" (GPU if the cluster has GPUs, else NPU, else HPU, else CPU), or one of "gpu", "xpu", "npu", "hpu", "cpu".',
    flag=flag(
        "--accelerator",
        parse=str.lower,
        choices=ACCELERATOR_CHOICES,
        help=f"device per worker: 'auto' ({auto_help()}) or one kind: {kinds_help()}; default: {{default}}",
    ),
)
RESOURCES_PER_WORKER = Option(
    {},
    check=empty_if_none(check_resources, {}),
    doc="Ray resources per worker, added to or overriding the default of 1 CPU plus 1 device, "
    'e.g. ``{"CPU": 4}``, ``{"GPU": 2}`` or ``{"GPU": 0.5}``.',
    flag=flag(
        "--resources-per-worker",
        parse=parse_resources,
        metavar="JSON",
        help="Ray resources per worker as a JSON object, e.g. '{{\"CPU\": 4}}', '{{\"GPU\": 2}}' "
        "(two GPUs per worker: LOCAL_RANK stays the local rank, raydist.get_context().device_index "
        "names the first of them) or '{{\"GPU\": 0.5}}' (two workers share a GPU). Default: 1 CPU "
        "plus 1 device",
    ),
)
PLACEMENT_STRATEGY = Option(
    None,
    check=optional(choice(PLACEMENT_STRATEGIES)),
    doc="PACK, SPREAD, STRICT_PACK or STRICT_SPREAD; None: PACK, or under ``num_nodes`` the node "
    "layout's own (STRICT_SPREAD), which no other strategy may replace.",
    flag=flag(
        "--placement-strategy",
        "--placement_strategy",
        parse=str.upper,
        choices=PLACEMENT_STRATEGIES,
        metavar="STRATEGY",
        help=f"Ray placement group strategy, one of {', '.join(PLACEMENT_STRATEGIES)} "
        f"(default: {DEFAULT_PLACEMENT_STRATEGY}); not with --nnodes, which places one bundle per node "
        "(STRICT_SPREAD)",
    ),
)
ADDRESS = Option(
    None,
    check=optional(check_address),
    doc="the Ray cluster to connect to when Ray is not initialised (else RAY_ADDRESS, else a local Ray is started).",
    flag=flag(
        "--address",
        metavar="ADDRESS",
        help="Ray cluster to run on: its GCS address HOST:PORT (port 6379 by default), "
        "ray://HOST:PORT for Ray Client, or 'auto'. Default: RAY_ADDRESS if set (as "
        "inside `ray job submit`), else the cluster started with `ray start` on this "
        "machine, else a private local Ray (no dashboard) that stops when the run ends",
    ),
)
LABEL_SELECTOR = Option(
    {},
    check=empty_if_none(check_label_selector, {}),
    doc='Ray node labels the workers\' nodes must match, in Ray\'s forms (``{"zone": "a"}``, '
    '``"!a"``, ``"in(a,b)"``, ``"!in(a,b)"``), or the same as ``"zone=a,pool=!spot"``.',
    flag=flag(
        "--label-selector",
        "--label_selector",
        metavar="KEY=VALUE[,...]",
        help="run only on Ray nodes whose labels match, in Ray's forms: zone=a, zone=!a, "
        "zone=in(a,b), zone=!in(a,b); several conditions separated by commas all apply",
    ),
)
ACCELERATOR_TYPE = Option(
    None,
    check=optional(check_accelerator_type),
    doc='only nodes with this accelerator type (Ray\'s ``accelerator_type:TYPE`` resource), e.g. "H100".',
    flag=flag(
        "--accelerator-type",
        "--accelerator_type",
        metavar="TYPE",
        help="run only on nodes with this accelerator type, as Ray names it (H100, A100, L4, ...: "
        "the node's accelerator_type:TYPE resource)",
    ),
)
EXCLUDE_NODES = Option(
    (),
    check=lambda name, value: check_exclude_nodes(name, value or ()),
    doc="nodes never to use: Ray node ids (or 8+ leading characters) or IP addresses.",
    flag=flag(
        "--exclude-nodes",
        "--exclude_nodes",
        metavar="NODE[,NODE...]",
        help="never run on these nodes: Ray node ids (or their first 8+ characters) or IP addresses",
    ),
)
