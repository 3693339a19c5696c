"""infra/k8s cannot drift from the code: every manifest validates against the Kubernetes API schemas (strict:
unknown fields fail) shipped inside the kubernetes-validate package — no network — and every setting a
manifest passes is one the code knows and docs/configuration.md documents: the quiver.yaml keys of the
ConfigMap, QUIVER_* variables, AIRFLOW__* variables (known to the installed Airflow and its providers),
and the flags of each `quiver` command the containers run."""

from __future__ import annotations

import copy
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from quiver.config import Config, load_config
from tests.cli_runs import quiver

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "infra" / "k8s").glob("*.yaml"))
KUBERNETES = "1.33.0"  # a version every maintained cluster serves these API groups in
CONFIG_DOC = (REPO / "docs" / "configuration.md").read_text()


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def walk(node: Any) -> Any:
    """Every mapping inside a document (containers, env entries, …), depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def embedded(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Manifests carried as text inside ConfigMaps (the KubernetesExecutor's pod templates)."""
    out = []
    for name, text in (doc.get("data") or {}).items():
        if name.endswith("pod-template.yaml"):
            out.append(yaml.safe_load(text))
    return out


def test_there_is_something_to_check() -> None:
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"Deployment", "StatefulSet", "Job", "CronJob", "ConfigMap", "Service", "Pod"} <= kinds
    assert {p.name for p in MANIFESTS} >= {"airflow-celery.yaml", "airflow-kubernetes.yaml", "flink-session.yaml",
                                           "flink-streaming.yaml", "config.yaml", "training-job.yaml"}


@pytest.mark.parametrize(("name", "doc"), documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_manifest_validates_against_the_kubernetes_schemas(name: str, doc: dict[str, Any]) -> None:
    for resource in (doc, *embedded(doc)):
        kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_the_validator_rejects_what_kubernetes_would() -> None:
    _, deployment = next((n, d) for n, d in documents() if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo of `resources`
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def documented_keys() -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", CONFIG_DOC, flags=re.M))


def test_the_configmap_quiver_yaml_has_only_known_documented_keys(tmp_path: Path) -> None:
    config_map = next(d for _, d in documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "quiver-config")
    text = config_map["data"]["quiver.yaml"]
    (tmp_path / "quiver.yaml").write_text(text)
    loaded = load_config(tmp_path)  # unknown keys or bad values raise
    # A section (`kafka:`, `spark:`) stands for the flat keys it reads into, each documented by its own row.
    sections = {"kafka": {"kafka_bootstrap", "kafka_properties", "kafka_group_prefix"},
                "spark": {"spark_master", "spark_conf"}}
    keys = set().union(*(sections.get(k, {k}) for k in yaml.safe_load(text)))
    assert keys <= documented_keys(), keys - documented_keys()
    assert loaded.artifact_root.startswith("s3://")  # pods on other machines share one store
    assert loaded.flink_jobmanager == "flink-jobmanager:8081"
    services = {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == "Service"}
    host, _, port = loaded.flink_jobmanager.partition(":")
    assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    templates = {n for _, d in documents() for n in (d.get("data") or {})}
    assert Path(loaded.gpu_pod_template).name in templates | {"gpu-pod-template.yaml"}


def env_names() -> set[str]:
    names = set()
    for _, doc in documents():
        for resource in (doc, *embedded(doc)):
            for node in walk(resource):
                if isinstance(node.get("name"), str) and ("value" in node or "valueFrom" in node):
                    names.add(node["name"])
            if resource.get("kind") == "ConfigMap" and resource["metadata"]["name"] == "airflow-env":
                names.update(resource["data"])
    return names


def test_every_quiver_variable_is_a_documented_setting() -> None:
    keys = {f.name for f in fields(Config)} - {"root"}
    for name in (n for n in env_names() if n.startswith("QUIVER_")):
        key = name.removeprefix("QUIVER_").lower()
        assert key in keys or f"`{name}`" in CONFIG_DOC, f"{name} is neither a quiver.yaml key nor documented"
        if key in keys:
            assert key in documented_keys()


def test_every_airflow_variable_is_an_airflow_setting() -> None:
    from airflow.configuration import conf

    conf.load_providers_configuration()  # [celery] and [kubernetes_executor] come from the providers
    known = conf.configuration_description
    names = [n for n in env_names() if n.startswith("AIRFLOW__")]
    assert "AIRFLOW__CORE__EXECUTOR" in names
    for name in names:
        section, key = name.removeprefix("AIRFLOW__").lower().split("__", 1)
        assert key in known.get(section, {}).get("options", {}), f"{name}: Airflow has no [{section}] {key}"


def quiver_commands() -> list[tuple[str, list[str]]]:
    """(subcommand, flags) of every `quiver …` a container runs."""
    found = []
    for _, doc in documents():
        for node in walk(doc):
            if "image" not in node:
                continue
            words: list[str] = [*node.get("command", []), *node.get("args", [])]
            text = " ".join(words)
            for match in re.finditer(r"\.venv/bin/quiver\s+([a-z-]+)((?:\s+\S+)*)", text):
                flags = re.findall(r"(--[a-z][a-z-]*)", match.group(2))
                found.append((match.group(1), flags))
    return found


def test_every_quiver_command_and_flag_exists() -> None:
    commands = quiver_commands()
    assert {c for c, _ in commands} >= {"serve", "stream", "train", "backfill"}
    helps: dict[str, str] = {}
    for command, flags in commands:
        if command not in helps:
            # In process: the flags are the subject, not the executable (COLUMNS and PATH as the subprocess had).
            done = quiver(command, "--help", cwd=REPO, timeout=120, env={"COLUMNS": "300", "PATH": ""})
            assert done.returncode == 0, f"quiver {command}: {done.stderr[-500:]}"
            helps[command] = done.stdout
        for flag in flags:
            assert re.search(rf"{re.escape(flag)}\b", helps[command]), f"quiver {command} has no {flag}"
