"""The Kubernetes manifests and the Dockerfile agree with the services they run.

Each overlay is rendered with `kubectl kustomize` (kubectl ships Kustomize), then every container's
arguments are parsed by the service's own flag parser, and the wiring is followed end to end: gateway ->
target replicas (StatefulSet DNS names on the headless Service), target -> draft (a Service, or a
container in the same pod), probes and Services -> declared container ports, NetworkPolicies -> pods.
Every rendered object is also validated, offline and strictly (unknown fields are errors), against the
OpenAPI schemas of the Kubernetes versions the manifests target (kubernetes-validate bundles them).
No cluster is needed; no image is built (that needs a Docker daemon).
"""

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from draft_service.config import parse_args as parse_draft_args
from gateway.config import parse_args as parse_gateway_args
from target_service.config import parse_args as parse_target_args

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu"]
# The oldest Kubernetes the manifests support (docs/deploy.md) and the newest whose schemas the package bundles.
KUBERNETES_VERSIONS = ["1.32", "1.37"]
# API groups that ship with Kubernetes; anything else is a custom resource with no bundled schema.
BUILT_IN_GROUPS = {"", "apps", "batch", "policy", "autoscaling"}
PARSERS = {"target_service": parse_target_args, "draft_service": parse_draft_args, "gateway": parse_gateway_args}


def render(folder: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (which bundles kustomize) is not installed: the overlays cannot be rendered here")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    return [(w, c) for w in workloads(docs) for c in w["spec"]["template"]["spec"]["containers"]]


def service_of(container: dict) -> str:
    assert container["command"][:2] == ["python", "-m"], container["command"]
    return container["command"][2]


def parse(container: dict, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for key in [k for k in os.environ if k.startswith("SSD_")]:
        monkeypatch.delenv(key)
    for env in container.get("env", []):
        if "secretKeyRef" in env.get("valueFrom", {}):
            monkeypatch.setenv(env["name"], "a-key-from-the-secret")
    return PARSERS[service_of(container)](container["args"])


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def declared_ports(container: dict) -> dict[str, int]:
    return {p.get("name", str(p["containerPort"])): p["containerPort"] for p in container.get("ports", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict]]:
    return request.param, render(K8S / "overlays" / request.param)


def test_every_container_parses_with_its_service_flags_and_listens_on_a_declared_port(overlay, monkeypatch):
    _, docs = overlay
    seen = set()
    for _, c in containers(docs):
        config = parse(c, monkeypatch)
        seen.add(service_of(c))
        addresses = [config.http_address, config.grpc_address] if service_of(c) == "gateway" else [config.address]
        for address in addresses:
            assert address.startswith("0.0.0.0:"), f"{c['name']} must listen on the pod IP for probes: {address}"
            assert port_of(address) in declared_ports(c).values(), (c["name"], address)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                spec = c[probe].get("grpc") or c[probe].get("httpGet")
                port = spec["port"]
                assert (declared_ports(c)[port] if isinstance(port, str) else port) in declared_ports(c).values()
    assert seen == {"target_service", "draft_service", "gateway"}


def test_gateway_targets_are_the_statefulset_replicas_on_the_headless_service(overlay, monkeypatch):
    _, docs = overlay
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "ssd-target"]
    headless = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    target_container = next(c for c in sts["spec"]["template"]["spec"]["containers"] if service_of(c) == "target_service")
    target_port = port_of(parse(target_container, monkeypatch).address)
    assert headless["spec"]["ports"][0]["port"] == target_port
    (gateway,) = [c for _, c in containers(docs) if service_of(c) == "gateway"]
    targets = parse(gateway, monkeypatch).targets
    name, service = sts["metadata"]["name"], headless["metadata"]["name"]
    assert sorted(targets) == [f"{name}-{i}.{service}:{target_port}" for i in range(sts["spec"]["replicas"])]


def replica_names(sts: dict) -> list[str]:
    """A StatefulSet's per-replica DNS names on its headless Service: name-0.service, name-1.service, ..."""
    name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    return [f"{name}-{i}.{service}" for i in range(sts["spec"].get("replicas", 1))]


def test_each_target_reaches_every_draft(overlay, monkeypatch):
    """Each --draft-address of a target is a draft container in its pod, a Service selecting draft pods, or one
    replica of the draft StatefulSet on its headless Service; with a draft StatefulSet, a target has every
    replica (the CPU overlay runs two)."""
    _, docs = overlay
    draft_sets = [w for w in workloads(docs) if w["kind"] == "StatefulSet"
                  and [service_of(x) for x in w["spec"]["template"]["spec"]["containers"]] == ["draft_service"]]
    replicas = {host: sts for sts in draft_sets for host in replica_names(sts)}
    for workload, c in containers(docs):
        if service_of(c) != "target_service":
            continue
        addresses = parse(c, monkeypatch).draft_addresses
        assert addresses, c["name"]
        if draft_sets:
            assert sorted(a.rsplit(":", 1)[0] for a in addresses) == sorted(replicas)
        for address in addresses:
            host, port = address.rsplit(":", 1)
            if host == "127.0.0.1":  # a draft container in the same pod
                pod = workload["spec"]["template"]["spec"]["containers"]
                drafts = [d for d in pod if service_of(d) == "draft_service"]
                assert [port_of(parse(d, monkeypatch).address) for d in drafts] == [int(port)]
                assert all(any(m["mountPath"] == "/dev/shm" for m in x["volumeMounts"]) for x in [c, *drafts])
                continue
            service_name = replicas[host]["spec"]["serviceName"] if host in replicas else host
            service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service_name)
            assert service["spec"]["ports"][0]["port"] == int(port)
            if host in replicas:
                assert service["spec"]["clusterIP"] == "None"  # headless: per-replica DNS names
            pods = [w for w in workloads(docs) if matches(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
            assert [service_of(x) for w in pods for x in w["spec"]["template"]["spec"]["containers"]] == ["draft_service"]


def test_sd_speculates_the_shape_ssd_serve_picks_for_the_draft(overlay, monkeypatch):
    """Token trees of 8 for a neural draft's sd requests (the fastest shape measured here), chains for n-gram."""
    from deploy.local import default_tree_budget

    _, docs = overlay
    (draft,) = {parse(c, monkeypatch).draft for _, c in containers(docs) if service_of(c) == "draft_service"}
    for _, c in containers(docs):
        if service_of(c) == "target_service":
            tree = parse(c, monkeypatch).speculation.tree
            assert (tree.budget if tree is not None else 0) == default_tree_budget(draft)


def test_services_and_network_policies_select_real_pods(overlay):
    _, docs = overlay
    pods = {w["metadata"]["name"]: w["spec"]["template"] for w in workloads(docs)}
    for svc in [d for d in docs if d["kind"] == "Service"]:
        selected = [t for t in pods.values() if matches(svc["spec"]["selector"], t["metadata"]["labels"])]
        assert len(selected) == 1, svc["metadata"]["name"]
        names = {n for c in selected[0]["spec"]["containers"] for n in declared_ports(c)}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names
    for policy in [d for d in docs if d["kind"] == "NetworkPolicy"]:
        protected = [t for t in pods.values() if matches(policy["spec"]["podSelector"]["matchLabels"], t["metadata"]["labels"])]
        assert len(protected) == 1, policy["metadata"]["name"]
        for rule in policy["spec"]["ingress"]:
            for source in rule.get("from", []):  # a rule without `from` (the metrics ports) admits any source
                assert any(matches(source["podSelector"]["matchLabels"], t["metadata"]["labels"]) for t in pods.values())


def test_images_and_gpu_requests(overlay):
    name, docs = overlay
    for _, c in containers(docs):
        assert c["image"] == f"ssd-serve:{'cuda' if name == 'gpu' else 'cpu'}"
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if name == "gpu" and service_of(c) != "gateway":
            assert gpus == 1 and "--device=cuda" in c["args"]
        else:
            assert gpus is None and "--device=cuda" not in c["args"]


def test_dockerfile_copies_what_the_package_needs():
    text = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    copied = [s for line in text.splitlines() if line.startswith("COPY ") for s in line.split()[1:-1]]
    for source in copied:
        assert (ROOT / source).exists(), source
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {pattern.removesuffix("*") for pattern in setuptools["packages"]["find"]["include"]}
    needed = packages | {"drafts", "pyproject.toml", "README.md", "LICENSE"}  # every package it installs
    assert needed <= set(copied), needed - set(copied)
    exposed = {int(p) for line in text.splitlines() if line.startswith("EXPOSE ") for p in line.split()[1:]}
    assert exposed == {8000, 50050, 50051, 50052}


def test_every_metrics_port_is_declared_annotated_and_admitted(overlay, monkeypatch):
    """A model service's --metrics-port is a declared container port; each pod's prometheus.io/port names one of
    its metrics ports (the gateway's is its HTTP port); the network policies let Prometheus reach them."""
    _, docs = overlay
    admitted = {p["port"] for d in docs if d["kind"] == "NetworkPolicy" for rule in d["spec"]["ingress"]
                if "from" not in rule for p in rule["ports"]}
    for workload in workloads(docs):
        pod = workload["spec"]["template"]
        ports = set()
        for c in pod["spec"]["containers"]:
            config = parse(c, monkeypatch)
            port = port_of(config.http_address) if service_of(c) == "gateway" else config.metrics_port
            assert port in declared_ports(c).values(), (c["name"], port)
            ports.add(port)
            assert service_of(c) == "gateway" or port in admitted, (c["name"], port)
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) in ports, workload["metadata"]["name"]


def is_built_in(doc: dict) -> bool:
    group = doc["apiVersion"].rpartition("/")[0]
    return group in BUILT_IN_GROUPS or group.endswith(".k8s.io")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_api_schema(overlay, version):
    _, docs = overlay
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if not is_built_in(doc):  # a custom resource (e.g. a ServiceMonitor): its CRD's schema is not bundled
            assert doc["apiVersion"].count("/") == 1 and doc["metadata"]["name"], name
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = list(e.absolute_path)
            pytest.fail(f"{name} is not a valid Kubernetes {version} object: {e.message} at {where}")


def test_the_schema_check_catches_a_misspelt_field_and_a_wrong_type(overlay):
    _, docs = overlay
    sts = next(d for d in docs if d["kind"] == "StatefulSet")  # the targets' (the drafts may have one too)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    misspelt = {**container, "readinesProbe": container["readinessProbe"]}
    del misspelt["readinessProbe"]
    for planted in ({**sts, "spec": {**sts["spec"], "replicas": "two"}},
                    {**sts, "spec": {**sts["spec"], "template": {**sts["spec"]["template"], "spec": {
                        **sts["spec"]["template"]["spec"], "containers": [misspelt]}}}}):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(planted, KUBERNETES_VERSIONS[0], strict=True)
