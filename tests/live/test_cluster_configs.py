"""Checks for the cluster configs in cluster_configs/.

Every file must parse, the Ray cluster-launcher configs must have the keys
`ray up` needs, every config must install raydist, and no firewall rule,
security group or Kubernetes Service may open one of Ray's ports to the whole
internet.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
import yaml

CONFIG_DIR = Path(__file__).resolve().parents[2] / "cluster_configs"
LAUNCHER_CONFIGS = ["local.yaml", "aws-gpu.yaml", "gcp-gpu.yaml"]
KUBERAY_CONFIG = "kuberay-rayjob.yaml"
ALL_CONFIGS = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))

# GCS, dashboard / job API, Ray client server.
RAY_PORTS = (6379, 8265, 10001)
LAUNCHER_KEYS = {
    "cluster_name",
    "max_workers",
    "upscaling_speed",
    "idle_timeout_minutes",
    "provider",
    "auth",
    "file_mounts",
    "setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
}
ALL_PORTS = range(0, 65536)


def load(name: str) -> list[Any]:
    with open(CONFIG_DIR / name) as f:
        return list(yaml.safe_load_all(f))


def is_world(cidr: Any) -> bool:
    """True for a CIDR covering every address: 0.0.0.0/0, ::/0."""
    try:
        return ipaddress.ip_network(str(cidr).strip(), strict=False).prefixlen == 0
    except ValueError:
        return False


def port_range(spec: Any) -> range:
    """A GCP port spec ("22", "6000-7000") or a port number, as a range."""
    low, _, high = str(spec).partition("-")
    return range(int(low), int(high or low) + 1)


def opened(ports: Iterable[range], targets: tuple[int, ...], ranges: bool) -> list[int]:
    """The target ports a rule's port ranges open. With ranges=False only
    single-port entries count, not ranges that happen to cover a target."""
    return sorted({t for r in ports for t in targets if t in r and (ranges or len(r) == 1)})


def aws_rule_ports(rule: dict[str, Any]) -> list[range]:
    protocol = str(rule.get("IpProtocol", "")).lower()
    if protocol in ("-1", "all"):
        return [ALL_PORTS]
    if protocol not in ("tcp", "6", "udp", "17"):
        return []  # icmp and friends have no ports
    if rule.get("FromPort") in (None, -1) or rule.get("ToPort") in (None, -1):
        return [ALL_PORTS]
    return [range(int(rule["FromPort"]), int(rule["ToPort"]) + 1)]


def aws_rule_sources(rule: dict[str, Any]) -> list[Any]:
    sources = [rule.get("CidrIp"), rule.get("CidrIpv6")]
    sources += [r.get("CidrIp") for r in rule.get("IpRanges", [])]
    sources += [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
    return [s for s in sources if s]


def gcp_rule_ports(rule: dict[str, Any]) -> list[range]:
    result: list[range] = []
    for allowed in rule.get("allowed", []):
        protocol = str(allowed.get("IPProtocol", "")).lower()
        if protocol == "all" or (protocol in ("tcp", "udp") and not allowed.get("ports")):
            result.append(ALL_PORTS)
        elif protocol in ("tcp", "udp"):
            result += [port_range(p) for p in allowed["ports"]]
    return result


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (path, node) for `node` and everything nested in it."""
    yield path, node
    if isinstance(node, dict):
        children: Iterable[tuple[Any, Any]] = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        children = ()
    for key, child in children:
        yield from walk(child, f"{path}/{key}")


def public_ray_port_exposures(config: Any, ports: Iterable[int] = RAY_PORTS, ranges: bool = True) -> list[str]:
    """Describe every rule in `config` that opens one of `ports` to 0.0.0.0/0
    or ::/0: AWS security-group rules, GCP firewall rules, Kubernetes
    LoadBalancer Services and KubeRay `serviceType: LoadBalancer`. Port ranges
    and "all ports" rules count unless ranges=False. Empty list = clean."""
    ports = tuple(ports)
    found: list[str] = []
    for path, node in walk(config):
        if not isinstance(node, dict):
            continue
        if "IpProtocol" in node and any(is_world(s) for s in aws_rule_sources(node)):
            hit = opened(aws_rule_ports(node), ports, ranges)
            if hit:
                found.append(f"{path or '/'}: AWS rule opens {hit} to the world")
        if node.get("direction", "INGRESS") == "INGRESS" and any(is_world(s) for s in node.get("sourceRanges", [])):
            hit = opened(gcp_rule_ports(node), ports, ranges)
            if hit:
                found.append(f"{path or '/'}: GCP firewall opens {hit} to the world")
        if node.get("kind") == "Service" and node.get("spec", {}).get("type") == "LoadBalancer":
            spec = node["spec"]
            sources = spec.get("loadBalancerSourceRanges") or ["0.0.0.0/0"]
            service_ports = [port_range(p.get("port", 0)) for p in spec.get("ports", [])]
            service_ports += [port_range(p["targetPort"]) for p in spec.get("ports", []) if isinstance(p.get("targetPort"), int)]
            hit = opened(service_ports, ports, ranges)
            if hit and any(is_world(s) for s in sources):
                found.append(f"{path or '/'}: LoadBalancer Service exposes {hit} to the world")
        if node.get("serviceType") == "LoadBalancer":
            found.append(f"{path or '/'}: KubeRay head service is a LoadBalancer")
    return found


def installs_raydist(doc: dict[str, Any]) -> bool:
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands") for c in doc.get(key) or []]
    if any("pip install" in c and re.search(r"\braydist\b", c) for c in commands):
        return True
    runtime_env = yaml.safe_load(doc.get("spec", {}).get("runtimeEnvYAML") or "{}")
    pip = runtime_env.get("pip") or []
    packages = pip.get("packages", []) if isinstance(pip, dict) else pip
    return any(re.match(r"raydist\b", p) for p in packages)


def test_expected_configs_exist() -> None:
    assert set(LAUNCHER_CONFIGS + [KUBERAY_CONFIG]) <= set(ALL_CONFIGS)


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_config_parses(name: str) -> None:
    docs = load(name)
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_keys(name: str) -> None:
    (config,) = load(name)
    assert config.keys() >= LAUNCHER_KEYS
    if config["provider"]["type"] != "local":  # the local provider makes its own node type
        assert config["head_node_type"] in config["available_node_types"]
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert "--head --port=6379" in head and "--dashboard-host=127.0.0.1" in head
    assert "--address=$RAY_HEAD_IP:6379" in worker
    assert "RAY_AUTH_MODE=token" in head and "RAY_AUTH_MODE=token" in worker


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_matches_ray_schema(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    autoscaler = pytest.importorskip("ray.autoscaler")
    schema = json.loads((Path(autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(load(name)[0], schema)


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_no_ray_port_open_to_world(name: str) -> None:
    assert public_ray_port_exposures(load(name)) == []


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_config_installs_raydist(name: str) -> None:
    assert any(installs_raydist(d) for d in load(name))


def test_kuberay_rayjob() -> None:
    (job,) = load(KUBERAY_CONFIG)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"].startswith("raydist run")
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"]["authOptions"]["mode"] == "token"
    gpus = [
        c["resources"]["limits"].get("nvidia.com/gpu", 0)
        for group in spec["rayClusterSpec"]["workerGroupSpecs"]
        for c in group["template"]["spec"]["containers"]
    ]
    assert sum(gpus) > 0
    assert spec["backoffLimit"] == 0  # a retried failed job can otherwise end as succeeded


def test_kuberay_rayjob_asks_for_the_layout_its_pods_give() -> None:
    (job,) = load(KUBERAY_CONFIG)
    spec = job["spec"]
    words = spec["entrypoint"].split()
    nnodes, per_node = int(words[words.index("--nnodes") + 1]), int(words[words.index("-n") + 1])
    (group,) = [g for g in spec["rayClusterSpec"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (container,) = group["template"]["spec"]["containers"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == nnodes  # one pod per node rank
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == per_node
    assert spec["shutdownAfterJobFinishes"] is True and spec.get("submissionMode", "K8sJobMode") == "K8sJobMode"


def test_configs_pin_one_ray_version() -> None:
    text = "\n".join((CONFIG_DIR / n).read_text() for n in ALL_CONFIGS)
    pins = re.findall(r"ray\[default\]==([\w.]+)", text)
    pins += re.findall(r"rayproject/ray:([0-9][\w.]*?)(?:-|\s|$)", text)
    pins += re.findall(r'rayVersion:\s*"?([\w.]+)', text)
    assert pins and len(set(pins)) == 1, pins


BAD_CONFIGS = {
    "aws-dashboard": {"IpPermissions": [{"IpProtocol": "tcp", "FromPort": 8265, "ToPort": 8265, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]},
    "aws-all-traffic-ipv6": {"IpPermissions": [{"IpProtocol": "-1", "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}]},
    "aws-range": {"IpPermissions": [{"IpProtocol": "tcp", "FromPort": 6000, "ToPort": 7000, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]},
    "gcp-gcs": {"firewall": {"sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp", "ports": ["6379"]}]}},
    "gcp-all-tcp": {"firewall": {"sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp"}]}},
    "k8s-loadbalancer": {"kind": "Service", "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}},
    "kuberay-loadbalancer": {"headGroupSpec": {"serviceType": "LoadBalancer"}},
}
GOOD_CONFIGS = {
    "aws-ssh-and-intra-group": {
        "IpPermissions": [
            {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-123"}]},
            {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "10.0.0.0/16"}]},
        ]
    },
    "gcp-internal-and-ssh": {
        "firewall": [
            {"sourceRanges": ["10.128.0.0/9"], "allowed": [{"IPProtocol": "all"}]},
            {"sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]},
            {"sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "icmp"}]},
        ]
    },
    "k8s-restricted-loadbalancer": {
        "kind": "Service",
        "spec": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.0/24"], "ports": [{"port": 8265}]},
    },
    "k8s-clusterip": {"kind": "Service", "spec": {"type": "ClusterIP", "ports": [{"port": 8265}]}},
}


@pytest.mark.parametrize("config", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_checker_flags_public_ray_ports(config: dict[str, Any]) -> None:
    assert public_ray_port_exposures(config)


@pytest.mark.parametrize("config", GOOD_CONFIGS.values(), ids=GOOD_CONFIGS.keys())
def test_checker_accepts_private_rules(config: dict[str, Any]) -> None:
    assert public_ray_port_exposures(config) == []


def test_checker_ranges_option() -> None:
    assert public_ray_port_exposures(BAD_CONFIGS["aws-range"], ranges=False) == []
    assert public_ray_port_exposures(BAD_CONFIGS["aws-dashboard"], ranges=False)


def test_slurm_recipe_starts_ray_with_symmetric_run_and_promises_the_layout() -> None:
    import subprocess

    recipe = CONFIG_DIR / "slurm-symmetric-run.sbatch"
    assert subprocess.run(["bash", "-n", str(recipe)], capture_output=True, check=False).returncode == 0
    text = recipe.read_text()
    assert re.search(r"^#SBATCH --ntasks-per-node=1$", text, flags=re.M)  # one symmetric-run per node
    assert 'ray symmetric-run --address "$address" --min-nodes "$nodes"' in text
    assert 'raydist run --address "$address" --nnodes "$nodes" -n "$per_node"' in text
    assert "RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}" in text
