"""The docs describe what exists: every quiver.yaml key, every monitoring setting and alert sink type, the
shipped monitoring.yaml, and links that lead somewhere."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from quiver.config import Config, load_config
from quiver.monitoring import settings as monitoring_settings
from quiver.monitoring.alerts import sinks_from_config
from quiver.monitoring.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()


def documented_keys(section: str) -> set[str]:
    """Keys in the first column of the tables under the `## section` heading."""
    body = CONFIGURATION.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", body, flags=re.M))


def test_every_quiver_yaml_key_is_documented() -> None:
    keys = {f.name for f in fields(Config)} - {"root"}
    assert keys == documented_keys("quiver.yaml")


def test_every_monitoring_setting_and_sink_type_is_documented() -> None:
    assert documented_keys("monitoring.yaml") == monitoring_settings._KEYS
    for kind in ("log", "webhook", "airflow_asset"):
        assert f"{{type: {kind}}}" in CONFIGURATION or f"type: {kind}" in CONFIGURATION
        assert f"* `{kind}` —" in CONFIGURATION
    sinks_from_config([{"type": "log"}, {"type": "webhook", "url": "http://127.0.0.1:9/x"},
                       {"type": "airflow_asset", "trigger_dir": "/tmp/t"}])  # the documented options build


def test_the_shipped_monitoring_yaml_is_real_and_holds_the_defaults() -> None:
    path = REPO / "monitoring.yaml"
    assert path.exists()
    config = load_config(REPO / "quiver.yaml")
    shipped = load_settings(config)
    assert shipped.alert_sinks[0] == {"type": "log"} and shipped.on_failure == "continue"
    assert shipped.quarantine_dir == config.offline_dir / "_quarantine" / "batches"
    assert shipped.expectations_dir == config.catalog_dir / "expectations"


def test_links_in_readme_and_docs_lead_to_files() -> None:
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} → {target}")
    assert not broken, broken
