"""How many workers of which kind, with which resources, on which nodes, and
whether the cluster can ever host them. Pure: the cluster's nodes come in as
records.

Node selection (label selector, accelerator type, excluded nodes) decides
which nodes count at all; the node layout (``num_nodes`` x
``workers_per_node``) asks for one bundle of P workers' resources per node
under STRICT_SPREAD, so a node qualifies only if it can hold all P.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.config import NODE_ID_LABEL
from raydist.core.accelerators import AUTO_ORDER, BY_NAME, CPU, Accelerator
from raydist.pool.records import ClusterNode
from raydist.pool.rules.text import fmt_resources, per_node_text

if TYPE_CHECKING:
    from raydist.config import RunConfig

# A private Ray raydist starts has this many logical CPUs beyond the machine's, for Ray Data's
# tasks (they need a CPU beside the workers'); its node says how many under this label, and a
# default-sized group leaves them out.
DATA_CPUS_LABEL = "raydist-data-cpus"
ACCELERATOR_TYPE_RESOURCE = "accelerator_type:"  # Ray's resource per accelerator type: accelerator_type:H100
# What each worker asks of its accelerator type's resource (Ray's own remote(accelerator_type=) amount).
ACCELERATOR_TYPE_AMOUNT = 0.001


def resolve_accelerator(accelerator: str, resources_per_worker: Mapping[str, float], nodes: List[ClusterNode]) -> Accelerator:
    """The accelerator kind each worker gets.

    "auto" takes a device resource named in ``resources_per_worker`` (so
    ``{"GPU": 2}`` means GPU workers), else the first kind the cluster has,
    else CPU.
    """
    if accelerator != "auto":
        return BY_NAME[accelerator]
    for row in AUTO_ORDER:
        if resources_per_worker.get(row.ray_resource or "", 0) > 0:
            return row
    for row in AUTO_ORDER:
        if row.ray_resource not in resources_per_worker and any(node.resources.get(row.ray_resource or "", 0) >= 1 for node in nodes):
            return row
    return CPU


def worker_bundle(
    accelerator: Accelerator, resources_per_worker: Mapping[str, float], accelerator_type: Optional[str] = None
) -> Dict[str, float]:
    """One worker's bundle: 1 CPU (+1 device) unless ``resources_per_worker``
    says otherwise, plus a sliver of ``accelerator_type:TYPE`` (as Ray's own
    ``remote(accelerator_type=)``), which only nodes of that type have."""
    bundle: Dict[str, float] = {"CPU": 1.0}
    if accelerator.ray_resource is not None:
        bundle[accelerator.ray_resource] = 1.0
    bundle.update(resources_per_worker)
    if accelerator_type is not None:
        bundle[ACCELERATOR_TYPE_RESOURCE + accelerator_type] = ACCELERATOR_TYPE_AMOUNT
    bundle = {name: amount for name, amount in bundle.items() if amount > 0}
    if not bundle:
        raise ValueError(
            f"resources_per_worker={dict(resources_per_worker)!r} leaves a worker with no resources; "
            "Ray places a worker only with at least one (e.g. a fraction of a CPU)"
        )
    return bundle


def default_num_workers(accelerator: Accelerator, bundle: Mapping[str, float], nodes: List[ClusterNode]) -> int:
    """One worker per device of the chosen kind (per share of one, for
    fractional amounts), or per CPU slot when workers have no device; 0 when
    the cluster has none."""
    resource = accelerator.ray_resource or "CPU"
    amount = bundle.get(resource)
    if not amount:  # CPU workers asking for no CPU: as many as their other resources allow
        return workers_that_fit(bundle, [node.resources for node in nodes], "PACK")
    return sum(int(max(0.0, node.resources.get(resource, 0.0) - kept_for_data(node, resource)) // amount) for node in nodes)


def kept_for_data(node: ClusterNode, resource: str) -> float:
    """The CPUs of ``node`` a private Ray keeps for Ray Data (``DATA_CPUS_LABEL``); 0 for another resource."""
    if resource != "CPU":
        return 0.0
    try:
        return max(0.0, float(node.labels.get(DATA_CPUS_LABEL, 0)))
    except ValueError:  # a label someone else set
        return 0.0


def spares_text(num_workers: int, spares: int) -> str:
    """ " (3 + 1 spare)" after a count of workers that includes spares; "" without."""
    return f" ({num_workers - spares} + {spares} spare)" if spares else ""


def infeasibility(bundle: Mapping[str, float], num_workers: int, strategy: str, nodes: List[ClusterNode], spares: int = 0) -> Optional[str]:
    """Why the cluster as it is can never host these workers, or None if it can.

    All bundles are equal, so counting how many fit on each node is exact.
    ``spares`` of ``num_workers`` are spare workers.
    """
    possible = workers_that_fit(bundle, [node.resources for node in nodes], strategy)
    how = {"STRICT_PACK": "on one node", "STRICT_SPREAD": "on distinct nodes"}.get(strategy, "in the cluster")
    if possible >= num_workers:
        return None
    totals: Dict[str, float] = {}
    for node in nodes:
        for name, amount in node.resources.items():
            totals[name] = totals.get(name, 0.0) + amount
    asked = {name: amount * num_workers for name, amount in bundle.items()}
    has = {name: totals.get(name, 0.0) for name in bundle}
    per_node = [{name: node.resources.get(name, 0.0) for name in bundle} for node in nodes]
    return (
        f"{num_workers} workers{spares_text(num_workers, spares)} of {fmt_resources(bundle)} each ({strategy}) asked for {fmt_resources(asked)} in all, "
        f"but at most {possible} such workers fit {how}: the cluster has {fmt_resources(has)} "
        f"over {len(nodes)} node(s) {per_node_text(per_node)}"
    )


def workers_that_fit(bundle: Mapping[str, float], free_per_node: Sequence[Mapping[str, float]], strategy: str) -> int:
    """How many workers of ``bundle`` fit in ``free_per_node`` under ``strategy``
    (all bundles are equal, so counting per node is exact)."""
    fits = [int(min(free.get(name, 0.0) // amount for name, amount in bundle.items())) for free in free_per_node]
    if strategy == "STRICT_PACK":
        return max(fits, default=0)
    if strategy == "STRICT_SPREAD":
        return sum(1 for fit in fits if fit >= 1)
    return sum(fits)


def elastic_size(min_workers: int, max_workers: int, fit_now: int) -> Optional[int]:
    """As many workers as fit now, up to ``max_workers``; None below ``min_workers``."""
    size = min(max_workers, fit_now)
    return size if size >= min_workers else None


# -- which nodes a run may use ------------------------------------------------


def label_matches(value: Optional[str], condition: str) -> bool:
    """Ray's label-selector semantics for one label: ``v`` and ``in(v1,v2)``
    need the label with such a value; ``!v`` and ``!in(...)`` also match a
    node without the label."""
    negated = condition.startswith("!")
    body = condition[1:] if negated else condition
    if body.startswith("in(") and body.endswith(")"):
        allowed = {item.strip() for item in body[3:-1].split(",")}
    else:
        allowed = {body}
    found = value is not None and value in allowed
    return not found if negated else found


def is_excluded(node: ClusterNode, exclude: Sequence[str]) -> bool:
    """``exclude`` entries are node ids, leading parts of one (8+ characters), or IPs."""
    return any(node.ip == entry or node.node_id.lower().startswith(entry.lower()) for entry in exclude)


@dataclass(frozen=True)
class NodeSelection:
    """Which nodes a run may use."""

    label_selector: Mapping[str, str] = field(default_factory=dict)
    accelerator_type: Optional[str] = None
    exclude: Tuple[str, ...] = ()

    @classmethod
    def of(cls, config: "RunConfig", also_excluded: Sequence[str] = ()) -> "NodeSelection":
        """The run's selection; ``also_excluded``: node ids the run itself has excluded (unhealthy, a straggler's)."""
        return cls(dict(config.label_selector), config.accelerator_type, (*config.exclude_nodes, *also_excluded))

    @property
    def active(self) -> bool:
        return bool(self.label_selector or self.accelerator_type or self.exclude)

    def allows(self, node: ClusterNode) -> bool:
        if is_excluded(node, self.exclude):
            return False
        if self.accelerator_type and node.resources.get(ACCELERATOR_TYPE_RESOURCE + self.accelerator_type, 0) <= 0:
            return False
        return all(label_matches(node.labels.get(key), condition) for key, condition in self.label_selector.items())

    def matching(self, nodes: Sequence[ClusterNode]) -> List[ClusterNode]:
        return [node for node in nodes if self.allows(node)]

    def ray_selector(self, nodes: Sequence[ClusterNode]) -> Dict[str, str]:
        """The label selector for every placement-group bundle: the user's,
        plus Ray's node-id label leaving out the excluded nodes among ``nodes``.
        (The accelerator type travels as a resource in the bundle.)"""
        selector = dict(self.label_selector)
        excluded = sorted(node.node_id for node in nodes if is_excluded(node, self.exclude))
        if excluded:
            selector[NODE_ID_LABEL] = f"!{excluded[0]}" if len(excluded) == 1 else f"!in({','.join(excluded)})"
        return selector

    def describe(self) -> str:
        """``label_selector {zone: a}, accelerator_type H100, exclude_nodes 10.0.0.5``."""
        parts = []
        if self.label_selector:
            parts.append("label_selector {" + ", ".join(f"{k}: {v}" for k, v in self.label_selector.items()) + "}")
        if self.accelerator_type:
            parts.append(f"accelerator_type {self.accelerator_type}")
        if self.exclude:
            parts.append(f"exclude_nodes {', '.join(self.exclude)}")
        return ", ".join(parts)


def node_name(node: ClusterNode) -> str:
    return f"node {node.node_id[:12]} ({node.ip})"


def _node_traits(node: ClusterNode) -> str:
    """What a selection looks at on a node: its labels (but Ray's node id) and accelerator type."""
    labels = {k: v for k, v in node.labels.items() if k != NODE_ID_LABEL}
    types = [name[len(ACCELERATOR_TYPE_RESOURCE) :] for name in node.resources if name.startswith(ACCELERATOR_TYPE_RESOURCE)]
    traits = ["labels {" + ", ".join(f"{k}: {v}" for k, v in labels.items()) + "}"]
    if types:
        traits.append(f"accelerator type {', '.join(types)}")
    return f"{node_name(node)} {' '.join(traits)}"


def selection_text(selection: NodeSelection, nodes: Sequence[ClusterNode]) -> str:
    """Which of ``nodes`` the selection matched, each named; '' without a selection."""
    if not selection.active:
        return ""
    matched = selection.matching(nodes)
    if not matched:
        return f"no node of {len(nodes)} matches {selection.describe()}; the nodes: " + "; ".join(_node_traits(node) for node in nodes)
    return f"{len(matched)} of {len(nodes)} node(s) match {selection.describe()}: " + ", ".join(map(node_name, matched))


# -- the node layout: num_nodes x workers_per_node -------------------------------


def node_capacity(worker: Mapping[str, float], resources: Mapping[str, float]) -> int:
    """How many workers of ``worker`` a node with ``resources`` holds."""
    return workers_that_fit(worker, [resources], "PACK")


def node_bundle(worker: Mapping[str, float], per_node: int) -> Dict[str, float]:
    """One node's bundle: ``per_node`` workers' resources."""
    return {name: amount * per_node for name, amount in worker.items()}


def node_layout_infeasibility(
    worker: Mapping[str, float], per_node: int, num_nodes: int, nodes: Sequence[ClusterNode], selection: NodeSelection
) -> Optional[str]:
    """Why ``num_nodes`` distinct nodes that can each hold ``per_node`` workers
    cannot be found among ``nodes`` (all alive ones), or None if they can.
    Names how many nodes qualify and what each can hold."""
    matched = selection.matching(nodes)
    capacity = {node.node_id: node_capacity(worker, node.resources) for node in matched}
    qualify = sum(1 for held in capacity.values() if held >= per_node)
    if qualify >= num_nodes:
        return None
    among = (
        f"of the {len(matched)} node(s) that match {selection.describe()}" if selection.active else f"of the cluster's {len(nodes)} node(s)"
    )
    holds = "; ".join(f"{node_name(node)} holds {capacity[node.node_id]}" for node in matched)
    text = (
        f"{num_nodes} node(s) x {per_node} worker(s) of {fmt_resources(worker)} each needs {num_nodes} distinct "
        f"nodes that can each hold {per_node} ({fmt_resources(node_bundle(worker, per_node))} per node), but only "
        f"{qualify} {among} can" + (f": {holds}" if holds else "")
    )
    if selection.active and len(matched) < len(nodes):
        text += f" ({selection_text(selection, nodes)})"
    return text


@dataclass(frozen=True)
class Request:
    """What one group asks of the cluster: placement-group bundles of
    ``per_bundle`` workers each (P under num_nodes, else 1), between
    ``sizes[0]`` and ``sizes[1]`` of them, on the nodes ``selection`` allows."""

    worker: Mapping[str, float]  # one worker's resources
    per_bundle: int
    sizes: Tuple[int, int]  # (min, max) bundles
    strategy: str
    selection: NodeSelection = field(default_factory=NodeSelection)
    node_layout: bool = False  # torchrun's layout: one bundle per node, on distinct nodes
    spares: int = 0  # of the bundles in ``sizes``, spare workers (named so in messages)

    @property
    def bundle(self) -> Dict[str, float]:
        return node_bundle(self.worker, self.per_bundle)

    def infeasibility(self, nodes: Sequence[ClusterNode]) -> Optional[str]:
        """Why ``nodes`` can never host ``sizes[0]`` bundles, or None."""
        if self.node_layout:
            return node_layout_infeasibility(self.worker, self.per_bundle, self.sizes[0], nodes, self.selection)
        matched = self.selection.matching(nodes)
        if self.selection.active and not matched:
            return selection_text(self.selection, nodes)
        reason = infeasibility(self.bundle, self.sizes[0], self.strategy, matched, self.spares)
        if reason is not None and self.selection.active:
            reason += f" ({selection_text(self.selection, nodes)})"
        return reason

    def room(self, free_per_node: Mapping[str, Mapping[str, float]], nodes: Sequence[ClusterNode], taken: Sequence[str] = ()) -> int:
        """Bundles that fit now on the allowed ``nodes``, leaving out the nodes in ``taken``
        (a node-layout group never takes a second bundle on a node it holds)."""
        allowed = frozenset(node.node_id for node in self.selection.matching(nodes)) - frozenset(taken)
        free = [resources for node_id, resources in free_per_node.items() if node_id in allowed]
        return workers_that_fit(self.bundle, free, self.strategy)


def placement_request(
    config: "RunConfig", worker: Mapping[str, float], sizes: Tuple[int, int], spares: int = 0, also_excluded: Sequence[str] = ()
) -> Request:
    """The request for a run: node layout under ``num_nodes`` (``sizes`` in
    nodes), else one worker per bundle with the configured strategy, and
    ``spares`` more bundles for spare workers; never on ``also_excluded`` nodes."""
    selection = NodeSelection.of(config, also_excluded)
    if config.node_range is not None:
        return Request(dict(worker), config.workers_per_node or 1, config.node_range, "STRICT_SPREAD", selection, True)
    with_spares = (sizes[0] + spares, sizes[1] + spares)
    return Request(dict(worker), 1, with_spares, config.strategy, selection, spares=spares)
