"""deploy/kubernetes: every manifest parses, and names, ports, labels, mounts and the config agree."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from barrel_inference.config import Settings, load_settings
from barrel_inference.worker.__main__ import parse_args

K8S = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


def documents() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for d in documents() if d["kind"] == kind]


def one(kind: str, name: str) -> dict:
    (doc,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def mounts(container: dict, pod_spec: dict) -> dict[str, dict]:
    """mountPath -> the volume it mounts (with subPath)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    claims = {"cache"}  # volumeClaimTemplates
    out = {}
    for m in container.get("volumeMounts", []):
        assert m["name"] in volumes or m["name"] in claims, m["name"]
        out[m["mountPath"]] = {**volumes.get(m["name"], {"pvc": m["name"]}), "subPath": m.get("subPath")}
    return out


def secret_keys(name: str) -> set[str]:
    return set(one("Secret", name)["stringData"])


def config(tmp_path) -> Settings:
    cm = one("ConfigMap", "barrel-inference-config")
    path = tmp_path / "config.toml"
    path.write_text(cm["data"]["config.toml"])
    return load_settings(path, env={})


def test_every_manifest_has_kind_and_name():
    docs = documents()
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Secret", "Deployment", "Service", "StatefulSet", "ServiceMonitor"}
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]


def test_services_select_their_pods_and_ports():
    workloads = by_kind("Deployment") + by_kind("StatefulSet")
    for svc in by_kind("Service"):
        selector = svc["spec"]["selector"]
        matches = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, svc["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for c in matches[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports
    for w in workloads:
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()


def test_gateway_config_mounts_and_probes(tmp_path):
    dep = one("Deployment", "barrel-inference-gateway")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    m = mounts(c, pod)
    cfg_path = env["BARREL_INFERENCE_CONFIG"]
    assert m[cfg_path]["configMap"]["name"] == "barrel-inference-config" and m[cfg_path]["subPath"] == "config.toml"
    settings = config(tmp_path)
    assert c["ports"][0]["containerPort"] == settings.port and settings.host == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    # the gateway's own key and each worker's public key come from the mounted Secret
    keys_dir = str(Path(settings.curve_secret_key).parent)
    secret = m[keys_dir]["secret"]["secretName"]
    assert Path(settings.curve_secret_key).name in secret_keys(secret)
    for name, ms in settings.models.items():
        assert str(Path(ms.server_key).parent) == keys_dir and Path(ms.server_key).name in secret_keys(secret), name
    assert m[settings.model_cache_dir.rsplit("/", 1)[0]] and m[str(settings.run_dir())]


def test_config_endpoints_name_worker_pods_and_their_keys(tmp_path):
    settings = config(tmp_path)
    for name, ms in settings.models.items():
        host, port = ms.endpoint.removeprefix("tcp://").rsplit(":", 1)
        pod_name, service = host.split(".", 1)
        sts = one("StatefulSet", pod_name.rsplit("-", 1)[0])
        assert sts["spec"]["serviceName"] == service and int(pod_name.rsplit("-", 1)[1]) < sts["spec"]["replicas"]
        svc = one("Service", service)
        assert svc["spec"]["clusterIP"] == "None" and int(port) in [p["port"] for p in svc["spec"]["ports"]]
        pod = sts["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        args = parse_args(c["command"][3:])  # python -m barrel_inference.worker ...: the real flags
        assert args.model_name == name and args.bind == f"tcp://0.0.0.0:{port}"
        assert not args.insecure and args.curve_secret_key and args.curve_clients
        m = mounts(c, pod)
        key_dir, clients_dir = str(Path(args.curve_secret_key).parent), args.curve_clients
        assert Path(args.curve_secret_key).name in [i["path"] for i in m[key_dir]["secret"]["items"]]
        client_items = [i["path"] for i in m[clients_dir]["secret"]["items"]]
        assert client_items and all(p.endswith(".key") for p in client_items)
        # the worker's public key the gateway trusts and the gateway key the worker admits are a pair's halves
        assert Path(ms.server_key).stem == Path(args.curve_secret_key).stem
        assert Path(settings.curve_secret_key).stem + ".key" in client_items
        assert args.model_path.startswith(next(p for p, v in m.items() if v.get("pvc") == "cache"))
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_servicemonitor_scrapes_the_gateway_metrics_port():
    sm = one("ServiceMonitor", "barrel-inference")
    svc = one("Service", "barrel-inference")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in svc["spec"]["ports"]]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_image_runs_the_commands_the_manifests_use():
    dockerfile = (K8S.parent / "Dockerfile").read_text()
    assert 'CMD ["bictl", "serve"]' in dockerfile and "./scripts/setup" in dockerfile
    images = {c["image"] for d in by_kind("Deployment") + by_kind("StatefulSet") for c in d["spec"]["template"]["spec"]["containers"]}
    assert len(images) == 1
    user = next(line for line in dockerfile.splitlines() if line.startswith("USER "))
    for d in by_kind("Deployment") + by_kind("StatefulSet"):
        assert d["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(shlex.split(user)[1])
