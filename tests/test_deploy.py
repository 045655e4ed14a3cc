"""The Kubernetes manifests in deploy/: parsed with yaml, references checked (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferplane.config import parse_config
from inferplane.gateway.app import Gateway
from inferplane.state.config import StateBackend, StateConfig

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _docs() if d["kind"] == kind}


def _fleet_yaml() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        _by_kind("ConfigMap")["inferplane-fleet"]["data"]["fleet.yaml"]
    )
    return loaded


def test_every_object_is_namespaced_and_named() -> None:
    docs = _docs()
    assert {d["kind"] for d in docs} >= {
        "Namespace", "Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler",
        "ScaledObject",
    }  # fmt: skip
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "inferplane", d["metadata"]["name"]


def test_services_select_deployment_pods_on_declared_ports() -> None:
    deployments = _by_kind("Deployment")
    for name, svc in _by_kind("Service").items():
        selector = svc["spec"]["selector"]
        matches = [
            d
            for d in deployments.values()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert matches, f"service {name} selects no deployment"
        ports = {p["name"] for d in matches for c in d["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}  # fmt: skip
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, (name, port)
    for d in deployments.values():  # a Deployment selects its own template
        assert d["spec"]["selector"]["matchLabels"].items() <= (
            d["spec"]["template"]["metadata"]["labels"].items()
        )


def test_gateway_probes_hit_routes_the_gateway_serves_and_configmap_is_mounted() -> None:
    gw = _by_kind("Deployment")["inferplane-gateway"]
    pod = gw["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    app = Gateway(parse_config({k: v for k, v in _fleet_yaml().items() if k != "state"}))
    served = {r.resource.canonical for r in app.build_app().router.routes() if r.resource}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in served
        assert container[probe]["httpGet"]["port"] in {p["name"] for p in container["ports"]}
    assert {"/ready", "/health"} <= {
        container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")
    }
    assert (
        container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    )
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] in _by_kind("ConfigMap")
    mount = container["volumeMounts"][0]
    assert mount["name"] == volume["name"]
    config_arg = container["args"][container["args"].index("-c") + 1]
    assert config_arg == f"{mount['mountPath']}/{volume['configMap']['items'][0]['path']}"
    assert int(container["args"][container["args"].index("--workers") + 1]) >= 1
    drain_s = float(container["args"][container["args"].index("--drain-timeout-s") + 1])
    assert pod["terminationGracePeriodSeconds"] > drain_s  # streams drain before SIGKILL


def test_fleet_config_parses_and_points_at_the_redis_service() -> None:
    fleet = _fleet_yaml()
    state = StateConfig.model_validate(fleet["state"])
    assert state.backend is StateBackend.REDIS
    host = state.redis_url.split("//")[1].split(".")[0]
    assert host in _by_kind("Service")
    cfg = parse_config({k: v for k, v in fleet.items() if k != "state"})
    assert cfg.gateway.port == 8080 and cfg.endpoints


def test_autoscalers_target_existing_deployments_on_desired_replicas() -> None:
    deployments = _by_kind("Deployment")
    hpa = _by_kind("HorizontalPodAutoscaler")
    keda = _by_kind("ScaledObject")
    assert hpa and keda
    for obj in [*hpa.values(), *keda.values()]:
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
    for h in hpa.values():
        assert h["spec"]["minReplicas"] <= h["spec"]["maxReplicas"]
        names = [m["external"]["metric"]["name"] for m in h["spec"]["metrics"]]
        assert names == ["inferplane_desired_replicas"]
    for k in keda.values():
        assert "inferplane_desired_replicas" in k["spec"]["triggers"][0]["metadata"]["query"]
