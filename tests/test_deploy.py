"""The Kubernetes manifests in deploy/: parsed with yaml, references checked (no cluster).

The base set (deploy/*.yaml) is applied with exactly one of the autoscaler directories
(deploy/hpa/, deploy/keda/); each applied set is checked on its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from inferplane.config import FleetConfig, load_config, parse_config
from inferplane.gateway.app import Gateway
from inferplane.gateway.autoscale import AutoscaleController
from inferplane.state.config import StateBackend, StateConfig

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ALTERNATIVES = ("hpa", "keda")  # apply one: KEDA's own HPA and a second HPA would fight
AUTOSCALERS = ("HorizontalPodAutoscaler", "ScaledObject")
WORKLOADS = ("Deployment", "StatefulSet")
_POOL = re.compile(r'\bpool="([^"]+)"')


def _load(paths: list[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _manifests(folder: Path) -> list[Path]:
    """The files ``kubectl apply -f folder`` applies (Helm values files are not manifests)."""
    return sorted(p for p in folder.glob("*.yaml") if not p.name.endswith(".values.yaml"))


def _docs(alternative: str | None = None) -> list[dict[str, Any]]:
    paths = _manifests(DEPLOY) + ([] if alternative is None else _manifests(DEPLOY / alternative))
    return _load(paths)


def _by_kind(kind: str, docs: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in (_docs() if docs is None else docs)
            if d["kind"] == kind}  # fmt: skip


def _fleet_text() -> str:
    text: str = _by_kind("ConfigMap")["inferplane-fleet"]["data"]["fleet.yaml"]
    return text


def _fleet_yaml() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(_fleet_text())
    return loaded


def _without_redis(fleet: dict[str, Any]) -> dict[str, Any]:
    """The configmap's fleet without the cluster's Redis: state in memory, and so the loop's
    learned values (which live in that Redis)."""
    autoscale = {**fleet["autoscale"], "learned_store": "memory"}
    return {**{k: v for k, v in fleet.items() if k != "state"}, "autoscale": autoscale}


def _fleet(tmp_path: Path) -> FleetConfig:
    """The configmap's fleet.yaml through the real loader, as the gateway reads it."""
    path = tmp_path / "fleet.yaml"
    path.write_text(_fleet_text())
    return load_config(path)


def test_every_object_is_namespaced_and_named() -> None:
    docs = _docs() + _docs("hpa") + _docs("keda")
    assert {d["kind"] for d in docs} >= {
        "Namespace", "Deployment", "StatefulSet", "Service", "ConfigMap", *AUTOSCALERS,
    }  # fmt: skip
    assert not {d["kind"] for d in _docs()} & set(AUTOSCALERS)  # only in the alternatives
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "inferplane", d["metadata"]["name"]


def test_services_select_workload_pods_on_declared_ports() -> None:
    deployments = {**_by_kind("Deployment"), **_by_kind("StatefulSet")}
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
    app = Gateway(parse_config(_without_redis(_fleet_yaml())))
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
    cfg = parse_config(_without_redis(fleet))
    assert cfg.gateway.port == 8080 and cfg.endpoints


def test_configmap_runs_an_autoscale_loop_for_the_served_model(tmp_path: Path) -> None:
    cfg = _fleet(tmp_path)
    assert cfg.autoscale.enabled and cfg.autoscale.pools
    assert cfg.state.backend is StateBackend.REDIS  # fleet-wide demand, not each process's own
    assert cfg.autoscale.learned_store.value == "redis"  # a restarted pod keeps what was learned
    for pool in cfg.autoscale.pools:
        assert pool.model in cfg.served_models()
    # The gateway serves the loop's decisions, and the loop decides within each pool's bounds.
    app = Gateway(cfg.model_copy(update={"state": StateConfig()})).build_app()
    assert "/v1/autoscale" in {r.resource.canonical for r in app.router.routes() if r.resource}
    ctl = AutoscaleController(cfg.autoscale, CollectorRegistry(), lambda now: [], [])
    ctl.sense(0.0)
    decisions, _ = ctl.autoscaler.decide(ctl.sense(cfg.autoscale.tick_s), ctl.state)
    for pool, decision in zip(cfg.autoscale.pools, decisions, strict=True):
        assert decision.pool == pool.model
        assert pool.min_replicas <= decision.desired_total <= pool.max_replicas


def _targets(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["spec"]["scaleTargetRef"].get("kind", "Deployment"),
             o["spec"]["scaleTargetRef"]["name"])
            for kind in AUTOSCALERS for o in _by_kind(kind, docs).values()]  # fmt: skip


@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_each_applied_set_has_exactly_one_autoscaler_per_workload(alternative: str) -> None:
    docs = _docs(alternative)
    targets = _targets(docs)
    assert len(targets) == 1, targets  # one ScaledObject or one HPA, not both
    workloads = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in WORKLOADS}
    assert set(targets) <= workloads
    # both at once would put two autoscalers on one workload: why they are alternatives
    both = _targets(_docs("hpa") + _load(_manifests(DEPLOY / "keda")))
    assert len(both) > len(set(both))


def _pool(tmp_path: Path, model: str) -> Any:
    pools = {p.model: p for p in _fleet(tmp_path).autoscale.pools}
    assert model in pools, f"{model!r} is not a pool of the configmap's autoscale section"
    return pools[model]


def _serves(docs: list[dict[str, Any]], target: tuple[str, str]) -> str:
    """The model the target workload's engines serve (vLLM's --model)."""
    (container,) = _by_kind(target[0], docs)[target[1]]["spec"]["template"]["spec"]["containers"]
    model: str = container["args"][container["args"].index("--model") + 1]
    return model


def test_hpa_reads_one_pool_of_the_configmap_through_the_adapter(tmp_path: Path) -> None:
    docs = _docs("hpa")
    (hpa,) = _by_kind("HorizontalPodAutoscaler", docs).values()
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    # replicas = ceil(sum / averageValue): the loop's count (a Value target multiplies)
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    values = yaml.safe_load((DEPLOY / "hpa" / "prometheus-adapter.values.yaml").read_text())
    rules = {r["name"]["as"]: r for r in values["rules"]["external"]}
    rule = rules[metric["external"]["metric"]["name"]]
    assert "selector" not in metric["external"]["metric"]  # a label value cannot hold "/"
    (pool_name,) = set(_POOL.findall(rule["seriesQuery"] + rule["metricsQuery"]))
    assert rule["metricsQuery"].startswith("max(inferplane_desired_replicas{")
    pool = _pool(tmp_path, pool_name)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        pool.min_replicas,
        pool.max_replicas,
    )
    (target,) = _targets(docs)
    assert _serves(docs, target) == pool.model


def test_keda_reads_one_pool_of_the_configmap(tmp_path: Path) -> None:
    docs = _docs("keda")
    (obj,) = _by_kind("ScaledObject", docs).values()
    (trigger,) = obj["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"
    query = trigger["metadata"]["query"]
    assert query.startswith("max(inferplane_desired_replicas{")  # one value over the gateways
    (pool_name,) = set(_POOL.findall(query))
    pool = _pool(tmp_path, pool_name)
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (
        pool.min_replicas,
        pool.max_replicas,
    )
    assert obj["spec"]["pollingInterval"] == _fleet(tmp_path).autoscale.tick_s
    (target,) = _targets(docs)
    assert _serves(docs, target) == pool.model


def test_the_pools_endpoints_are_the_statefulsets_pods(tmp_path: Path) -> None:
    """The gateway can only route to replicas it lists: one endpoint per StatefulSet ordinal
    the autoscaler may run, at the pod's stable name behind the headless Service."""
    cfg = _fleet(tmp_path)
    for sts in _by_kind("StatefulSet").values():
        model = _serves(_docs(), ("StatefulSet", sts["metadata"]["name"]))
        pool = _pool(tmp_path, model)
        svc = _by_kind("Service")[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None"
        (port,) = svc["spec"]["ports"]
        host = f"{sts['spec']['serviceName']}.{sts['metadata']['namespace']}.svc.cluster.local"
        expected = {f"http://{sts['metadata']['name']}-{i}.{host}:{port['port']}"
                    for i in range(pool.max_replicas)}  # fmt: skip
        listed = [e for e in cfg.endpoints if model in e.models]
        assert {e.url for e in listed} == expected
        assert {e.gpu for e in listed} <= set(pool.gpus)
