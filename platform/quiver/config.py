"""Project configuration: one `quiver.yaml`, every key overridable by a QUIVER_* environment variable.

Relative paths (catalog, offline root, SQLite registry file) resolve against the config file's directory,
so commands behave the same from any working directory. The `spark:` section (master, any `spark.*` conf) is
the one nested key: it reads into `Config.spark_master` / `Config.spark_conf`, together `Config.spark`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from quiver.catalog.errors import QuiverError
from quiver.catalog.types import is_identifier
from quiver.kafka_properties import (
    env_pairs,
    flink_properties,
    kafka_property_values,
    librdkafka_settings,
    parse_kafka_properties_env,
    resolve_secrets,
    setting_text,
)

CONFIG_FILE = "quiver.yaml"
CONFIG_ENV = "QUIVER_CONFIG"


class NoProjectError(QuiverError):
    """A command that works on a project found no quiver.yaml (and was given none)."""


@dataclass(frozen=True)
class SparkSettings:
    """The user's Spark settings: the master and `spark.*` settings for the sessions Quiver starts (quiver.yaml's
    `spark:` section). Quiver adds its defaults where these say nothing (quiver.offline.engines)."""

    master: str = "local[2]"
    conf: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # A plain dict copy (picklable), values as Spark reads them: settings built in code get the checks too.
        object.__setattr__(self, "conf", spark_conf_values(self.conf, "Spark settings"))


@dataclass(frozen=True)
class KafkaSettings:
    """How Quiver reaches the project's Kafka (quiver.yaml's `kafka:` section): the brokers, any Kafka client
    property (Java names, e.g. security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location;
    secrets resolved from the environment) and the prefix of the consumer groups the stream job commits to."""

    bootstrap: str = ""
    properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    group_prefix: str = ""  # empty: quiver.<project>

    def __post_init__(self) -> None:
        # A plain dict copy, checked as quiver.yaml's are: settings built in code get the same refusals.
        object.__setattr__(self, "properties", kafka_property_values(self.properties, "Kafka settings"))

    def flink_properties(self) -> dict[str, str]:
        """The properties for Flink's Kafka SQL connector (`properties.<key>` of each source table): the Java
        names, Kafka's class names under the connector's shaded prefix (quiver.kafka_properties)."""
        return flink_properties(self.properties)

    def client_config(self) -> dict[str, str]:
        """The properties as librdkafka settings (the Python clients: offsets, --fresh, the demo producer),
        without bootstrap.servers; a QuiverError saying what to give where a property has no equivalent."""
        return librdkafka_settings(self.properties)

    @property
    def security_protocol(self) -> str:
        return self.properties.get("security.protocol", "PLAINTEXT").upper()

    def group(self, project: str, source: str) -> str:
        """The consumer group of one source's stream: `<prefix>.<source>`, by default `quiver.<project>.<source>`,
        so two projects (or environments) with a source of the same name never share offsets."""
        return f"{self.group_prefix or 'quiver.' + project}.{source}"


@dataclass(frozen=True)
class Config:
    """Settings of one Quiver project."""

    root: Path = field(default_factory=Path.cwd)
    project: str = "default"
    catalog: str = "feature_defs"
    registry_url: str = "sqlite:///.quiver/registry.db"
    offline_root: str = "data/offline"
    # Model artifacts, training references and label snapshots (quiver.artifacts): a folder or a URI such as
    # s3://bucket/prefix. The registry records keys relative to it, so any worker that reaches it can load.
    artifact_root: str = ".quiver"
    redis_url: str = ""  # empty: an embedded Redis is started for the demo
    engine: str = "duckdb"
    spark_master: str = "local[2]"  # quiver.yaml: spark: {master: …} (or this flat key)
    # Any `spark.*` setting of the sessions Quiver starts (quiver.yaml: spark: {conf: {…}}; QUIVER_SPARK_CONF=k=v,…)
    spark_conf: Mapping[str, str] = field(default_factory=dict, hash=False)
    flink_jobmanager: str = ""  # REST host:port of a Flink session cluster for `quiver stream`; empty: embedded
    kafka_bootstrap: str = ""  # Kafka brokers of the stream bindings' topics (wins over the catalog's); empty: theirs
    # Kafka client properties (quiver.yaml: kafka: {properties: {…}}) and the consumer groups' prefix
    kafka_properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    kafka_group_prefix: str = ""
    redis_timeout_s: float = 1.0
    api_key: str = ""  # feature server key (better: QUIVER_API_KEY in the environment)
    # The closed loop (dags/, pipelines/loop*.py): which model it watches, how much history a retrain uses,
    # where GPU work runs, and how long it waits for labelled traffic.
    loop_model: str = "fraud_model"
    loop_service: str = "fraud_model"
    loop_window_days: float = 7.0
    loop_retrain_calendar: str = "@weekly"  # cron of the retrain DAG's calendar fallback; empty: on drift only
    gpu_queue: str = "gpu"
    gpu_pool: str = "gpu"
    gpu_pod_template: str = ""  # KubernetesExecutor: pod template file of GPU tasks (train); empty: none
    loop_min_labelled: float = 300.0
    loop_poke_interval_s: float = 600.0
    loop_wait_timeout_s: float = 172_800.0
    loop_canary_steps: str = "0.05,0.25,0.5,1.0"  # canary traffic shares; the last must be 1.0 (promotion)
    loop_canary_min_rows: float = 500.0  # rows per arm and step before a guardrail may pass
    loop_canary_judge: str = ""  # overrides of the canary judge's settings, e.g. "log_loss_floor=0.05,alpha=0.1"
    loop_max_shadow_days: float = 7.0  # an inconclusive challenger is dropped (with an alert) after this long
    # Retraining by expected harm (docs/drift.md): a drift alone warns; a retrain starts when the label-free
    # estimate of the champion's ROC-AUC lies below its reference by more than this, with confidence (the
    # estimate's band clear of it), or when dataset drift has held for this many consecutive daily checks.
    loop_harm_auc_tolerance: float = 0.01
    loop_drift_persist_days: float = 2.0
    # Several prediction servers: each names its serving-log files (empty: $QUIVER_REPLICA_ID, else the host's
    # name) and, on an object store, keeps what the store cannot take yet in a bounded local spool.
    replica_id: str = ""
    spool_dir: str = ".quiver/spool"
    spool_max_mb: float = 1024.0

    @property
    def spark(self) -> SparkSettings:
        """The Spark master and the user's `spark.*` settings, as one value for the engines."""
        return SparkSettings(self.spark_master, self.spark_conf)

    @property
    def kafka(self) -> KafkaSettings:
        """The brokers, client properties and group prefix, as one value for the stream job and its clients.
        `${NAME}` in a property is filled in from the environment here, not when the file is read: the pods that
        share one quiver.yaml but never reach Kafka need not carry its secrets."""
        where = f"{self.root / CONFIG_FILE}: kafka.properties"
        return KafkaSettings(self.kafka_bootstrap, resolve_secrets(self.kafka_properties, where),
                             self.kafka_group_prefix)

    @property
    def catalog_dir(self) -> Path:
        return self._path(self.catalog)

    @property
    def offline_dir(self) -> Path:
        return self._path(self.offline_root)

    @property
    def artifact_location(self) -> str:
        """The artifact root: a URI as given, or an absolute folder (relative ones against the project)."""
        from quiver.artifacts import is_uri

        return self.artifact_root if is_uri(self.artifact_root) else str(self._path(self.artifact_root))

    @property
    def registry(self) -> str:
        """The registry URL with a relative SQLite path made absolute against the project root."""
        scheme, sep, rest = self.registry_url.partition(":///")
        # sqlite:///rel.db and sqlite+pysqlite:///rel.db are relative; sqlite:////abs.db is absolute, and so is
        # an SQLite URI filename (sqlite:///file:/abs.db?mode=ro&uri=true), passed on as it is.
        sqlite = sep and (scheme == "sqlite" or scheme.startswith("sqlite+"))
        if sqlite and rest and not rest.startswith(("/", ":memory:", "?", "file:")):
            return f"{scheme}:///{self._path(rest)}"
        return self.registry_url

    def _path(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.root / path


_ENV_PREFIX = "QUIVER_"
_KEYS = {f.name for f in fields(Config)} - {"root"}
_FLOAT_KEYS = {f.name for f in fields(Config) if f.type in ("float", float)}
_SPARK_SECTION = {"master": "spark_master", "conf": "spark_conf"}  # the `spark:` section's keys → Config fields
SPARK_CONF_ENV = _ENV_PREFIX + "SPARK_CONF"
# the `kafka:` section's keys → Config fields
_KAFKA_SECTION = {"bootstrap": "kafka_bootstrap", "properties": "kafka_properties", "group_prefix": "kafka_group_prefix"}
KAFKA_PROPERTIES_ENV = _ENV_PREFIX + "KAFKA_PROPERTIES"


# Set while a CLI command runs (quiver.cli.user_errors): a command without a project must refuse, not
# fall back to defaults and create ./.quiver/ wherever it was started. Library callers keep the defaults.
_PROJECT_REQUIRED: ContextVar[bool] = ContextVar("quiver_project_required", default=False)


@contextmanager
def project_required(required: bool = True) -> Iterator[None]:
    """Within the block, `load_config()` without a path raises NoProjectError when it finds no quiver.yaml."""
    token = _PROJECT_REQUIRED.set(required)
    try:
        yield
    finally:
        _PROJECT_REQUIRED.reset(token)


def find_config(start: Path | None = None) -> Path | None:
    """The project's quiver.yaml: the one QUIVER_CONFIG names, else the first in `start` (default: the working
    directory) or a folder above it, like git finds its repository; None when there is none."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        path = Path(named).expanduser()
        return path / CONFIG_FILE if path.is_dir() else path
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / CONFIG_FILE).is_file():
            return candidate / CONFIG_FILE
    return None


def no_project_message(start: Path | None = None) -> str:
    """The one line a command prints when it finds no project."""
    folder = (start or Path.cwd()).resolve()
    return (f"no {CONFIG_FILE} in {folder} or any folder above it: this command works on a Quiver project; "
            f"run it inside one, pass --config PATH, set {CONFIG_ENV}, or create one with `quiver init`")


def load_config(path: str | Path | None = None, *, require_project: bool | None = None) -> Config:
    """Read `path` (default: `find_config()`) and apply QUIVER_* environment overrides.

    `path` may also be a project directory holding quiver.yaml. Without a path and without a quiver.yaml
    anywhere, the defaults apply (a project rooted in the working directory), unless a project is required
    (`require_project`, default: inside `project_required()`, i.e. while a CLI command runs): then
    NoProjectError says where it looked.
    """
    named_by = ""  # how the file was named, for the error when it is missing
    if path:  # "" means none, as before
        config_path = Path(path).expanduser()
        if config_path.is_dir():
            config_path = config_path / CONFIG_FILE
    else:
        found = find_config()
        if found is None and (_PROJECT_REQUIRED.get() if require_project is None else require_project):
            raise NoProjectError(no_project_message())
        if found is not None and os.environ.get(CONFIG_ENV):
            named_by = f" (named by {CONFIG_ENV})"
        config_path = found or Path.cwd() / CONFIG_FILE
    explicit = bool(path) or bool(named_by)
    values: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = yaml.safe_load(config_path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise QuiverError(f"{config_path}: not valid YAML: {exc}") from None
        except OSError as exc:
            raise QuiverError(f"cannot read config file {config_path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise QuiverError(f"{config_path}: expected a mapping of settings at the top level")
        values.update(loaded)
        _read_spark_section(config_path, values)
        _read_kafka_section(config_path, values)
    elif explicit:
        raise QuiverError(f"config file {config_path}{named_by} does not exist")
    for key in _KEYS:
        env = os.environ.get(_ENV_PREFIX + key.upper())
        if env is not None:
            # QUIVER_SPARK_CONF overrides the file's Spark settings key by key; others replace the value.
            if key == "spark_conf":
                values[key] = {**values.get(key, {}), **parse_spark_conf_env(env)}
            elif key == "kafka_properties":
                values[key] = {**values.get(key, {}), **parse_kafka_properties_env(env, KAFKA_PROPERTIES_ENV)}
            else:
                values[key] = env
    unknown = set(values) - _KEYS
    if unknown:
        raise QuiverError(f"{config_path}: unknown setting(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"known: {', '.join(sorted(_KEYS | {'spark', 'kafka'}))}")
    for key, value in values.items():
        values[key] = _typed(config_path, key, value)
    config = Config(root=config_path.resolve().parent, **values)
    if config.engine not in ("duckdb", "spark"):
        raise QuiverError(f"{config_path}: engine must be duckdb or spark, got {config.engine!r}")
    if not is_identifier(config.project):
        raise QuiverError(f"{config_path}: project {config.project!r} must be a plain identifier")
    if not config.artifact_root.strip():
        raise QuiverError(f"{config_path}: artifact_root must name a folder or a URI (default .quiver)")
    if config.redis_timeout_s <= 0:
        raise QuiverError(f"{config_path}: redis_timeout_s must be positive, got {config.redis_timeout_s}")
    return config


def _typed(config_path: Path, key: str, value: Any) -> Any:
    # YAML and the environment both hand in loose types; a wrong one must be a clear error, not a crash later.
    if key in ("spark_conf", "kafka_properties"):
        return value  # checked where it was read (_read_*_section, parse_*_env)
    if key in _FLOAT_KEYS:
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise QuiverError(f"{config_path}: {key} must be a number, got {value!r}") from None
    if value is None:
        return ""
    if not isinstance(value, str):
        raise QuiverError(f"{config_path}: {key} must be a string, got {value!r}")
    return value


def _read_spark_section(config_path: Path, values: dict[str, Any]) -> None:
    """Fold the file's `spark:` section into the flat keys it stands for (spark_master, spark_conf); the flat
    spelling keeps working, and the two may not disagree."""
    if "spark_conf" in values:
        values["spark_conf"] = spark_conf_values(values["spark_conf"], f"{config_path}: spark_conf")

    def checked(name: str, value: Any) -> Any:
        if name == "conf":
            return spark_conf_values(value, f"{config_path}: spark.conf")
        if not isinstance(value, str) or not value.strip():
            raise QuiverError(f"{config_path}: spark.master must be a Spark master URL such as local[2] or "
                              f"spark://host:7077, got {value!r}")
        return value

    _fold_section(config_path, values, "spark", _SPARK_SECTION, "master and/or conf", checked)


def _read_kafka_section(config_path: Path, values: dict[str, Any]) -> None:
    """Fold the file's `kafka:` section (bootstrap, properties, group_prefix) into the flat keys it stands for;
    the flat spelling keeps working, and the two may not disagree."""
    if "kafka_properties" in values:
        values["kafka_properties"] = kafka_property_values(values["kafka_properties"],
                                                           f"{config_path}: kafka_properties")

    def checked(name: str, value: Any) -> Any:
        if name == "properties":
            return kafka_property_values(value, f"{config_path}: kafka.properties")
        if value is None:
            return ""
        if not isinstance(value, str):
            raise QuiverError(f"{config_path}: kafka.{name} must be a string, got {value!r}")
        if name == "group_prefix" and value and not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise QuiverError(f"{config_path}: kafka.group_prefix {value!r} may hold only letters, digits, '.', "
                              "'_' and '-'")
        return value

    _fold_section(config_path, values, "kafka", _KAFKA_SECTION, "bootstrap, properties and/or group_prefix",
                  checked)


def _fold_section(config_path: Path, values: dict[str, Any], section_name: str, keys: Mapping[str, str],
                  expected: str, checked: Callable[[str, Any], Any]) -> None:
    """Move the file's `section_name:` mapping into the flat keys its `keys` name (section key → Config field),
    each value through `checked`; a flat key the file also sets must agree with its section spelling."""
    section = values.pop(section_name, None)
    if section is None:
        return
    if not isinstance(section, dict):
        raise QuiverError(f"{config_path}: {section_name} must be a mapping with {expected}, got {section!r}")
    unknown = set(section) - set(keys)
    if unknown:
        raise QuiverError(f"{config_path}: {section_name}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"known: {', '.join(sorted(keys))}")
    for name, flat in keys.items():
        if name not in section:
            continue
        value = checked(name, section[name])
        if flat in values and values[flat] != value:
            raise QuiverError(f"{config_path}: {flat} ({values[flat]!r}) and {section_name}.{name} "
                              f"({section[name]!r}) differ; keep one, {section_name}.{name}")
        values[flat] = value


def spark_conf_values(raw: Any, where: str) -> dict[str, str]:
    """`raw` (a mapping of `spark.*` keys to scalars, from YAML or code) as Spark settings, every value a string
    as Spark reads it (true/false in lower case); a QuiverError naming `where` and the key otherwise."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuiverError(f"{where} must be a mapping of spark.* keys to values, got {raw!r}")
    conf: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.startswith("spark.") or key == "spark.":
            raise QuiverError(f"{where}: {key!r} is not a Spark setting (Spark's keys start with 'spark.')")
        if key == "spark.master":
            raise QuiverError(f"{where}: spark.master belongs in the spark section's master key, not in its conf")
        conf[key] = setting_text(value, where, key)
    return conf


def parse_spark_conf_env(text: str) -> dict[str, str]:
    """QUIVER_SPARK_CONF's value: `key=value` entries separated by commas (a value holding a comma, such as a
    list of jars, belongs in quiver.yaml)."""
    pairs = env_pairs(text, SPARK_CONF_ENV, "spark.sql.shuffle.partitions=64,spark.executor.memory=8g")
    return spark_conf_values(pairs, SPARK_CONF_ENV)


DEFAULT_CONFIG_TEXT = """\
# Quiver project settings. Every key can be overridden by QUIVER_<KEY> (e.g. QUIVER_REDIS_URL).
project: {project}
catalog: feature_defs          # directory of Python feature definitions
registry_url: sqlite:///.quiver/registry.db   # or postgresql+psycopg://user@host/db
offline_root: data/offline     # Parquet offline store
artifact_root: .quiver         # models, references, label snapshots: a shared folder or s3://bucket/prefix
redis_url: ""                  # empty: embedded Redis; redis://:password@host:6379/0, redis+cluster://h1:7000,h2:7000
engine: duckdb                 # duckdb (embedded) or spark
spark:
  master: local[2]             # or spark://host:7077
  # conf:                      # any spark.* setting of the sessions Quiver starts (QUIVER_SPARK_CONF=k=v,k=v)
  #   spark.sql.shuffle.partitions: 64
  #   spark.executor.memory: 8g
"""
