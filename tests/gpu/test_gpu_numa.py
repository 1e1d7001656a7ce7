"""``numa_binding="node"`` on the machine's real topology: the worker's threads
are bound to the CPUs of its GPU's NUMA node. On a machine of one NUMA node
binding could not be told from no binding: skipped, saying so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Set

import pytest
import torch
from gpu_fns import affinity

import raydist

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("gpu_ray")]

NODES = Path("/sys/devices/system/node")


def cpulist(text: str) -> Set[int]:
    """ "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: Set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def gpu_numa_node() -> int:
    """The NUMA node sysfs gives GPU 0's PCI device (-1: none given)."""
    props = torch.cuda.get_device_properties(0)
    if not hasattr(props, "pci_bus_id"):
        pytest.skip(f"torch {torch.__version__} does not report the GPU's PCI address")
    address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    path = Path("/sys/bus/pci/devices") / address / "numa_node"
    if not path.exists():
        pytest.skip(f"no {path}: sysfs gives no NUMA node for the GPU")
    return int(path.read_text())


def test_numa_binding_node_binds_the_worker_to_its_gpus_node() -> None:
    nodes = sorted(NODES.glob("node[0-9]*")) if NODES.is_dir() else []
    if len(nodes) < 2:
        pytest.skip(f"this machine has {len(nodes)} NUMA node(s): binding to the GPU's node would not change which CPUs a worker may use")
    node = gpu_numa_node()
    if node < 0:
        pytest.skip("sysfs gives the GPU no NUMA node (numa_node is -1): there is nothing to bind by")
    expected = cpulist((NODES / f"node{node}" / "cpulist").read_text()) & os.sched_getaffinity(0)
    [seen] = raydist.run(affinity, num_workers=1, resources_per_worker={"GPU": 1}, numa_binding="node")
    assert seen["device"] == "cuda:0"
    assert set(seen["cpus"]) == expected, f"bound to {seen['cpus']}, GPU 0 is on NUMA node {node}: {sorted(expected)}"
