"""A local single-node Kafka broker (KRaft: broker and controller in one JVM) for tests and laptops.

Started from the jars `make setup` fetches (`build/jars/kafka-broker/`, Kafka 4.1) with its own folder,
ports and log directory, on loopback only: like the embedded Redis, it is a stand-in for the team's cluster,
never a production deployment. `KafkaBroker` is the handle tests use to start, stop, kill and restart it;
tests that need security give it SASL users and TLS files (`make_test_certificates`) for extra listeners.
Topic helpers (create, produce keyed JSON records, end offsets) and `check_cluster` (one clear line when
the project's Kafka refuses or does not answer) use confluent-kafka with the project's `KafkaSettings`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quiver.catalog.errors import QuiverError
from quiver.config import KafkaSettings
from quiver.jars import KAFKA_BROKER, bundle_jars

T = TypeVar("T")
_RDKAFKA_LOG = logging.getLogger("quiver.kafka.client")
# check_cluster's client: every retry logs its failure, and the one line it raises says it all.
_QUIET = logging.Logger("quiver.kafka.check")  # not in the logging tree: nothing propagates
_QUIET.addHandler(logging.NullHandler())
_HEAP = "-Xmx512m"  # a test broker holds little; the default (¼ of RAM) would crowd Spark and Flink


class BrokerError(QuiverError):
    """The local broker could not start or answer."""


class KafkaUnreachable(QuiverError):
    """The project's Kafka refused Quiver's client (authentication, TLS) or nobody answered in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a test TLS setup: the CA that signed the broker's certificate, and the broker's keystore
    (its private key, unencrypted PKCS#8, then its certificate and the CA's), which Kafka reads as
    `ssl.keystore.type=PEM`."""

    ca: Path
    keystore: Path


def make_test_certificates(directory: Path, name: str = "ca") -> TlsFiles:
    """A fresh CA (`<name>.pem`) and a broker certificate it signed for 127.0.0.1 and localhost, made with
    openssl (for tests: nothing here is protected). A second call with another `name` gives a CA the first
    broker's certificate does not chain to (an untrusted certificate)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key = directory / f"{name}.key", directory / f"{name}.pem", directory / f"{name}-broker.key"
    csr, cert = directory / f"{name}-broker.csr", directory / f"{name}-broker.pem"
    san = directory / f"{name}-san.cnf"
    san.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "7",
         "-subj", f"/CN=Quiver test CA {name}"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "7",
         "-extfile", san],
    ):
        done = subprocess.run(["openssl", *map(str, command)], capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise BrokerError(f"openssl {command[0]} failed: {done.stderr.strip()[-500:]}")
    keystore = directory / f"{name}-broker-keystore.pem"
    keystore.write_text(key.read_text() + cert.read_text() + ca.read_text())
    return TlsFiles(ca=ca, keystore=keystore)


def _properties(directory: Path, port: int, controller_port: int, partitions: int,
                secured: Mapping[str, int], sasl_users: Mapping[str, str], tls: TlsFiles | None) -> str:
    listeners = {"PLAINTEXT": port, **secured}
    settings = {
        "process.roles": "broker,controller", "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": ",".join([*(f"{name}://127.0.0.1:{p}" for name, p in listeners.items()),
                               f"CONTROLLER://127.0.0.1:{controller_port}"]),
        "advertised.listeners": ",".join(f"{name}://127.0.0.1:{p}" for name, p in listeners.items()),
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(f"{name}:{name}" for name in (*listeners, "CONTROLLER")
                                                   if name != "CONTROLLER") + ",CONTROLLER:PLAINTEXT",
        "log.dirs": str(directory / "data"), "num.partitions": str(partitions),
        # One node: every internal topic with one replica, and no wait before the first rebalance.
        "offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1", "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1", "group.initial.rebalance.delay.ms": "0",
        # Flink's exactly-once Kafka sinks hold transactions up to the checkpoint interval; allow an hour.
        "transaction.max.timeout.ms": "3600000",
    }
    if sasl_users:  # PLAIN over SASL_PLAINTEXT (and SASL_SSL): the users and their passwords, in the broker's JAAS
        users = " ".join(f'user_{user}="{password}"' for user, password in sasl_users.items())
        settings["sasl.enabled.mechanisms"] = "PLAIN"
        for listener in ("sasl_plaintext", "sasl_ssl"):
            settings[f"listener.name.{listener}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};")
    if tls is not None:
        settings.update({"ssl.keystore.type": "PEM", "ssl.keystore.location": str(tls.keystore),
                         "ssl.client.auth": "none"})
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64, as Kafka makes them, never starting with "-" (one id
    in 64 did: the storage tool's argument parser then read it as an option and refused to format)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One broker process over `directory` (config, data, log); ports fixed at construction so a restart
    comes back at the same address with the same topics and offsets."""

    def __init__(self, directory: Path, port: int | None = None, controller_port: int | None = None,
                 partitions: int = 4, sasl_users: Mapping[str, str] | None = None,
                 tls: TlsFiles | None = None) -> None:
        """`sasl_users` (user → password) adds a SASL_PLAINTEXT listener (mechanism PLAIN), `tls` an SSL one,
        both a SASL_SSL one, each on its own loopback port (`bootstrap_for`); PLAINTEXT stays for the rest."""
        self.dir = directory
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.partitions = partitions
        self.sasl_users = dict(sasl_users or {})
        self.tls = tls
        protocols = [*(["SASL_PLAINTEXT"] if self.sasl_users else []), *(["SSL"] if tls else []),
                     *(["SASL_SSL"] if self.sasl_users and tls else [])]
        self.secured_ports = {protocol: free_port() for protocol in protocols}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, protocol: str) -> str:
        """The address of the listener speaking `protocol` (PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL)."""
        if protocol == "PLAINTEXT":
            return self.bootstrap
        if protocol not in self.secured_ports:
            raise BrokerError(f"this broker has no {protocol} listener (it has PLAINTEXT"
                              f"{''.join(', ' + p for p in self.secured_ports)})")
        return f"127.0.0.1:{self.secured_ports[protocol]}"

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.log"

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = os.pathsep.join(str(p) for p in bundle_jars(KAFKA_BROKER))
        return ["java", _HEAP, "-Dlog4j2.level=WARN", "-cp", classpath, main, *args]

    def _format(self, config: Path) -> None:
        if (self.dir / "data" / "meta.properties").exists():
            return
        out = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={new_cluster_id()}",
                                        "-c", str(config)),
                             capture_output=True, text=True, timeout=120)
        if out.returncode:
            raise BrokerError(f"formatting the Kafka log directory {self.dir / 'data'} failed:\n"
                              f"{(out.stdout + out.stderr)[-2000:]}")

    @property
    def config_file(self) -> Path:
        return self.dir / "server.properties"

    def command(self) -> list[str]:
        """Write the config (formatting the log directory on first use); the command that runs the broker."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(_properties(self.dir, self.port, self.controller_port, self.partitions,
                                                self.secured_ports, self.sasl_users, self.tls))
        self._format(self.config_file)
        return self._java("kafka.Kafka", str(self.config_file))

    def start(self, timeout: float = 60.0) -> None:
        """Start (or keep) the broker and wait until it answers metadata requests."""
        if self.proc is not None and self.proc.poll() is None:
            return
        command = self.command()
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (self.dir / "broker.pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None:
                self.proc = None
                raise BrokerError(f"the Kafka broker exited on port {self.port}:\n{log_tail(self.log_file)}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the Kafka broker did not answer within {timeout:.0f}s:\n{log_tail(self.log_file)}")
            time.sleep(0.2)

    def answers(self, timeout: float = 2.0) -> bool:
        from confluent_kafka.admin import AdminClient

        try:  # a refused connection first: librdkafka would log one error line per retry
            socket.create_connection(("127.0.0.1", self.port), timeout=timeout).close()
            meta = AdminClient(admin_config(self.bootstrap)).list_topics(timeout=timeout)
        except Exception:  # KafkaException when nobody answers
            return False
        # After a restart the broker answers before it leads its partitions again: not ready until it does.
        return all(p.leader >= 0 and p.error is None for t in meta.topics.values() for p in t.partitions.values())

    def stop(self, timeout: float = 30.0) -> None:
        """Shut down cleanly (SIGTERM: the broker flushes its logs and leaves the quorum)."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed beyond what the OS already has."""
        self._signal(signal.SIGKILL, 30.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _signal(self, sig: int, timeout: float) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` of a log file, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---- topics and records ----


def _retrying(call: Callable[[], T], timeout: float = 60.0) -> T:
    """`call()`, retried while the broker says the error is retriable (a restarted broker takes a few
    seconds to lead its partitions again)."""
    from confluent_kafka import KafkaError, KafkaException

    # librdkafka does not flag these as retriable on offset queries, though they pass once leaders settle.
    settling = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR, KafkaError._TIMED_OUT}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if not (code in settling or (error is not None and error.retriable())) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def admin_config(bootstrap: str, kafka: KafkaSettings | None = None) -> dict[str, Any]:
    """Client settings: the project's Kafka properties as librdkafka reads them (security, …), and librdkafka's
    own log lines to Python logging (not straight to stderr)."""
    return {**(kafka.client_config() if kafka is not None else {}), "bootstrap.servers": bootstrap,
            "logger": _RDKAFKA_LOG}


def check_cluster(bootstrap: str, kafka: KafkaSettings | None = None, timeout_s: float = 10.0) -> None:
    """Ask `bootstrap` for its metadata with the project's settings, once, before anything else talks to it: a
    KafkaUnreachable with one line saying why (authentication failed, a TLS handshake failed, nobody answered)
    within `timeout_s`, where librdkafka itself would retry for ever and only log."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    kafka = kafka or KafkaSettings()
    for key, path in kafka.client_config().items():  # librdkafka's own words for a missing file are obscure
        if key.endswith(".location") and not Path(path).is_file():
            raise KafkaUnreachable(f"Kafka at {bootstrap}: {path} ({key} from kafka.properties) is not a file")
    errors: list[KafkaError] = []
    try:
        settings: dict[str, Any] = {**admin_config(bootstrap, kafka), "logger": _QUIET, "error_cb": errors.append}
        admin = AdminClient(settings)
    except KafkaException as exc:  # a setting librdkafka refuses (an unknown name, a missing CA file)
        error = exc.args[0] if exc.args else exc
        raise KafkaUnreachable(f"Kafka at {bootstrap}: the client settings were refused: "
                               f"{error.str() if isinstance(error, KafkaError) else error}") from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:  # short slices: an authentication or TLS failure shows in `errors` long before the deadline
            admin.list_topics(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
            return
        except KafkaException:
            admin.poll(0)  # serves error_cb
        refused = next((e for e in errors if e.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL)), None)
        if refused is not None:
            raise KafkaUnreachable(_refusal(bootstrap, kafka, refused.code() == KafkaError._SSL, refused.str()))
        if time.monotonic() >= deadline:
            transport = [e.str() for e in errors if e.code() == KafkaError._TRANSPORT]
            raise KafkaUnreachable(f"Kafka at {bootstrap}: no broker answered within {timeout_s:g} s (security.protocol "
                                   f"{kafka.security_protocol})" + (f": {_reason(transport[-1])}" if transport else ""))


def _reason(text: str) -> str:
    """librdkafka's error text without the broker's address in front and the connection state behind."""
    text = re.sub(r"^\S+://\S+/(bootstrap|\d+): ", "", text)
    return re.sub(r" \(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$", "", text)


def _refusal(bootstrap: str, kafka: KafkaSettings, tls: bool, text: str) -> str:
    reason = _reason(text)
    if not tls:
        client = kafka.client_config()
        mechanism = client.get("sasl.mechanism") or client.get("sasl.mechanisms") or "GSSAPI"
        user = client.get("sasl.username")
        reason = reason.removeprefix("SASL authentication error: ")
        return (f"Kafka at {bootstrap}: authentication failed (SASL {mechanism}"
                f"{f' as {user!r}' if user else ''}): {reason}")
    if "certificate verify failed" in reason:
        trusted = kafka.client_config().get("ssl.ca.location") or "the system's CA certificates"
        detail = reason.partition(": broker certificate could not be verified")[0].removeprefix("SSL handshake failed: ")
        return (f"Kafka at {bootstrap}: TLS handshake failed: the broker's certificate is not trusted by {trusted} "
                f"({detail})")
    return f"Kafka at {bootstrap}: TLS handshake failed: {reason.removeprefix('SSL handshake failed: ')}"


def create_topic(bootstrap: str, topic: str, partitions: int, kafka: KafkaSettings | None = None) -> None:
    """Create `topic` with `partitions` partitions (an existing topic with as many is fine)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient(admin_config(bootstrap, kafka))
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise BrokerError(f"creating topic {topic!r} on {bootstrap}: {exc}") from exc
        have = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
        if have != partitions:
            raise BrokerError(f"topic {topic!r} exists with {have} partitions, not {partitions}") from exc


def fresh_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0,
                kafka: KafkaSettings | None = None) -> None:
    """`topic`, empty, with `partitions` partitions: an existing one is deleted first, and with it the offsets
    consumer groups committed on it (a fresh job's progress must not start from an old job's)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(bootstrap, kafka))
    deadline = time.monotonic() + timeout
    if topic in admin.list_topics(timeout=10).topics:
        try:
            admin.delete_topics([topic])[topic].result(timeout=30)
        except KafkaException as exc:
            raise BrokerError(f"deleting topic {topic!r} on {bootstrap}: {exc}") from exc
        while topic in admin.list_topics(timeout=10).topics:  # the deletion completes asynchronously
            if time.monotonic() > deadline:
                raise BrokerError(f"topic {topic!r} on {bootstrap} was not deleted within {timeout:.0f}s")
            time.sleep(0.2)
    while True:
        try:
            return create_topic(bootstrap, topic, partitions, kafka)
        except BrokerError:  # marked for deletion still, on a slow broker
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]],
            settings: Mapping[str, Any] | None = None,
            partition_of: Callable[[bytes | None], int] | None = None, kafka: KafkaSettings | None = None) -> int:
    """Send (key, value) records, idempotently (no duplicates on retries), and wait until all are
    acknowledged; returns how many. A record that could not be delivered raises, never vanishes.
    Records go to the partition of their key's hash, or `partition_of(key)`."""
    from confluent_kafka import Producer

    producer = Producer({**admin_config(bootstrap, kafka), "enable.idempotence": True, "linger.ms": 20,
                         "compression.type": "lz4", **(settings or {})})
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    sent = 0
    for key, value in records:
        while True:
            try:
                if partition_of is None:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                else:
                    producer.produce(topic, value=value, key=key, partition=partition_of(key),
                                     on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        sent += 1
        if sent % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or failed:
        raise BrokerError(f"{left + len(failed)} of {sent} records to {topic!r} were not delivered: "
                          f"{failed[:3] or 'flush timed out'}")
    return sent


class TopicOffsets:
    """A topic's end offsets and a consumer group's committed offsets, read through one consumer kept open (a
    status pass once a second would otherwise connect to every broker anew each time). It never subscribes
    or commits, so it never joins the group it reads; calls from several threads take turns."""

    def __init__(self, bootstrap: str, topic: str, group: str | None = None,
                 kafka: KafkaSettings | None = None) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self._lock = threading.Lock()
        self._consumer = Consumer({**admin_config(bootstrap, kafka), "enable.auto.commit": False,
                                   "group.id": group or f"quiver-offsets-{uuid.uuid4().hex}"})

    def _partitions(self) -> list[int]:
        return sorted(self._consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions)

    def ends(self) -> dict[int, int]:
        """partition → the offset after its last record."""
        from confluent_kafka import TopicPartition

        def end(partition: int) -> int:
            return int(self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)[1])

        with self._lock:
            return {p: _retrying(functools.partial(end, p)) for p in self._partitions()}

    def committed(self) -> dict[int, int]:
        """partition → the offset the group committed (-1 where none): a Flink Kafka source commits on
        checkpoints."""
        from confluent_kafka import TopicPartition

        with self._lock:
            parts = [TopicPartition(self.topic, p) for p in self._partitions()]
            got = _retrying(lambda: self._consumer.committed(parts, timeout=10))
        return {tp.partition: tp.offset for tp in got}

    def close(self) -> None:
        with self._lock:
            self._consumer.close()


def end_offsets(bootstrap: str, topic: str, kafka: KafkaSettings | None = None) -> dict[int, int]:
    """partition → the offset after its last record (one query; `TopicOffsets` for repeated ones)."""
    offsets = TopicOffsets(bootstrap, topic, kafka=kafka)
    try:
        return offsets.ends()
    finally:
        offsets.close()


def forget_group(bootstrap: str, group: str, kafka: KafkaSettings | None = None) -> None:
    """Delete consumer `group` and the offsets it committed (a group never created is fine). A Flink job's
    Kafka source assigns its partitions itself and never joins the group, so a stopped job leaves it empty."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(bootstrap, kafka))  # held while waiting: the future dies with its client
    try:
        _retrying(lambda: admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=60))
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND):
            raise BrokerError(f"deleting consumer group {group!r} on {bootstrap}: {exc}") from exc


def committed_offsets(bootstrap: str, group: str, topic: str, kafka: KafkaSettings | None = None) -> dict[int, int]:
    """partition → the offset `group` committed (-1 where none; one query, `TopicOffsets` for repeated ones)."""
    offsets = TopicOffsets(bootstrap, topic, group, kafka)
    try:
        return offsets.committed()
    finally:
        offsets.close()
