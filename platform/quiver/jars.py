"""Where the JVM jars Quiver runs with are: `build/jars/<bundle>/` of the checkout, filled by `make setup`.

`scripts/jars.sh` fetches them by name from Maven Central (cached in ~/.m2) and builds our own Java code
(infra/jvm/<bundle>/); nothing is committed. `QUIVER_JARS_DIR` points elsewhere (an image that baked them in).
"""

from __future__ import annotations

import os
from pathlib import Path

from quiver.catalog.errors import QuiverError

KAFKA_BROKER = "kafka-broker"  # a single-node KRaft broker's classpath (tests, the demo)
FLINK_KAFKA = "flink-kafka"  # Flink's Kafka SQL connector (one shaded jar)
REDIS_SINK = "redis-sink"  # our jar: the Flink sink writing tiles and last values to Redis, and the Kafka record parser
S3A = "s3a"  # hadoop-aws and its AWS SDK, for Spark's s3a://


def jars_dir() -> Path:
    """The folder holding one sub-folder per bundle."""
    configured = os.environ.get("QUIVER_JARS_DIR", "").strip()
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "build" / "jars"  # platform/quiver/ → the checkout


def bundle_jars(bundle: str) -> list[Path]:
    """Every jar of `bundle`, sorted; a QuiverError that says how to get them when there are none."""
    folder = jars_dir() / bundle
    found = sorted(folder.glob("*.jar"))
    if not found:
        raise QuiverError(f"the JVM jars of {bundle!r} are missing ({folder}): run `make setup` "
                          f"(scripts/jars.sh {bundle} fetches them from Maven Central)")
    return found


def has_bundle(bundle: str) -> bool:
    return any((jars_dir() / bundle).glob("*.jar"))
