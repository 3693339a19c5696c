"""quiver.yaml's `kafka:` section: parsing, secrets from the environment, refused keys, and the translation of
the Java client's properties for Flink's shaded connector and for librdkafka (the Python clients)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quiver import QuiverError, load_config
from quiver.config import KafkaSettings
from quiver.kafka_properties import librdkafka_settings, parse_jaas

PLAIN = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="{password}";'
SHADED_PLAIN = "org.apache.flink.kafka.shaded.org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("QUIVER_"):
            monkeypatch.delenv(key)


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "quiver.yaml").write_text("project: shop\n" + text)
    return tmp_path / "quiver.yaml"


SECURED = """\
kafka:
  bootstrap: b-1.msk:9096,b-2.msk:9096
  group_prefix: shop.prod
  properties:
    security.protocol: SASL_SSL
    sasl.mechanism: SCRAM-SHA-512
    sasl.jaas.config: >-
      org.apache.kafka.common.security.scram.ScramLoginModule required
      username="quiver" password="${KAFKA_PASSWORD}";
    ssl.truststore.location: /etc/kafka/ca.pem
    ssl.truststore.type: PEM
    request.timeout.ms: 20000
"""


def test_the_kafka_section_reads_into_the_settings_with_secrets_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", 'pa"ss')
    config = load_config(project(tmp_path, SECURED))
    kafka = config.kafka
    assert kafka.bootstrap == config.kafka_bootstrap == "b-1.msk:9096,b-2.msk:9096"
    assert kafka.group("shop", "tx") == "shop.prod.tx"
    assert kafka.properties["request.timeout.ms"] == "20000"  # numbers as the client reads them
    assert kafka.properties["sasl.jaas.config"].endswith('password="pa\\"ss";')  # escaped inside JAAS quotes
    assert config.kafka_properties["sasl.jaas.config"].endswith('password="${KAFKA_PASSWORD}";')  # kept as written
    assert kafka.client_config() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "quiver",
        "sasl.password": 'pa"ss', "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_a_missing_secret_names_the_file_the_key_and_the_variable_when_kafka_is_used(tmp_path: Path) -> None:
    path = project(tmp_path, SECURED)
    config = load_config(path)  # pods that never reach Kafka share this file without the secret
    with pytest.raises(QuiverError) as caught:
        _ = config.kafka
    assert str(caught.value) == (f"{path}: kafka.properties: sasl.jaas.config refers to ${{KAFKA_PASSWORD}}, but the "
                                 "environment variable KAFKA_PASSWORD is not set (set it, e.g. from a Kubernetes "
                                 "Secret, where Quiver runs)")


def test_the_flat_keys_still_work_and_may_not_disagree_with_the_section(tmp_path: Path) -> None:
    assert load_config(project(tmp_path, "kafka_bootstrap: k:9092\n")).kafka.bootstrap == "k:9092"
    same = load_config(project(tmp_path, "kafka_bootstrap: k:9092\nkafka: {bootstrap: 'k:9092'}\n"))
    assert same.kafka_bootstrap == "k:9092"
    path = project(tmp_path, "kafka_bootstrap: k:9092\nkafka: {bootstrap: 'other:9092'}\n")
    with pytest.raises(QuiverError, match=r"kafka_bootstrap \('k:9092'\) and kafka.bootstrap \('other:9092'\) "
                                          "differ; keep one, kafka.bootstrap"):
        load_config(path)


def test_the_environment_overrides_properties_key_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", "x")
    monkeypatch.setenv("QUIVER_KAFKA_PROPERTIES", "sasl.mechanism=SCRAM-SHA-256, client.id=quiver-stream")
    monkeypatch.setenv("QUIVER_KAFKA_GROUP_PREFIX", "shop.staging")
    kafka = load_config(project(tmp_path, SECURED)).kafka
    assert (kafka.properties["sasl.mechanism"], kafka.properties["client.id"]) == ("SCRAM-SHA-256", "quiver-stream")
    assert kafka.properties["security.protocol"] == "SASL_SSL"
    assert kafka.group("shop", "tx") == "shop.staging.tx"
    monkeypatch.setenv("QUIVER_KAFKA_PROPERTIES", "security.protocol")
    with pytest.raises(QuiverError, match=r"QUIVER_KAFKA_PROPERTIES: 'security\.protocol' is not key=value"):
        load_config(project(tmp_path, SECURED))


@pytest.mark.parametrize(("text", "message"), [
    ("kafka: {properties: {bootstrap.servers: 'a:9092'}}\n",
     "kafka.properties: bootstrap.servers is set by Quiver: the brokers belong in the kafka section's bootstrap"),
    ("kafka: {properties: {group.id: g}}\n", "kafka.properties: group.id is set by Quiver: the stream job's consumer "
                                             "groups are <group_prefix>.<source> (kafka.group_prefix)"),
    ("kafka: {properties: {enable.auto.commit: true}}\n", "enable.auto.commit is set by Quiver"),
    ("kafka: {properties: {auto.offset.reset: earliest}}\n", "auto.offset.reset is set by Quiver"),
    ("kafka: {properties: {properties.security.protocol: SSL}}\n",
     "properties.security.protocol: write the Kafka client's own name, security.protocol"),
    ("kafka: {properties: {ssl.enabled.protocols: [TLSv1.3]}}\n",
     "kafka.properties: ssl.enabled.protocols must be a string, a number or true/false"),
    ("kafka: {properties: [security.protocol]}\n", "kafka.properties must be a mapping of Kafka client properties"),
    ("kafka: {brokers: 'a:9092'}\n", "kafka: unknown key(s) brokers; known: bootstrap, group_prefix, properties"),
    ("kafka: 'a:9092'\n", "kafka must be a mapping with bootstrap, properties and/or group_prefix"),
    ("kafka: {group_prefix: 'shop prod'}\n", "kafka.group_prefix 'shop prod' may hold only letters, digits"),
    ("kafka: {bootstrap: 9092}\n", "kafka.bootstrap must be a string, got 9092"),
])
def test_bad_kafka_settings_are_errors_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = project(tmp_path, text)
    with pytest.raises(QuiverError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_settings_built_in_code_get_the_same_refusals() -> None:
    with pytest.raises(QuiverError, match=r"Kafka settings: group\.id is set by Quiver"):
        KafkaSettings("a:9092", {"group.id": "mine"})


def test_flink_gets_the_java_names_with_kafka_classes_under_the_connectors_shaded_prefix() -> None:
    kafka = KafkaSettings("a:9092", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN.format(password="p"),
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
        "ssl.ca.location": "/ca.pem", "librdkafka.debug": "security"})  # the Python clients' only
    assert kafka.flink_properties() == {
        "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",  # not Kafka's
        "sasl.jaas.config": f'{SHADED_PLAIN} required username="alice" password="p";',
        "sasl.login.callback.handler.class": "org.apache.flink.kafka.shaded.org.apache.kafka.common.security."
                                             "oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL", "ssl.truststore.location": "/ca.pem",
        "ssl.truststore.type": "PEM"}
    already = KafkaSettings("a:9092", {"sasl.jaas.config": f'{SHADED_PLAIN} required username="a" password="b";'})
    assert already.flink_properties()["sasl.jaas.config"].count("shaded") == 1  # never shaded twice


def test_the_connector_jar_holds_the_shaded_login_modules() -> None:
    """The prefix is the connector's: its jar carries the login modules under it (skipped without the jar)."""
    import zipfile

    from quiver.jars import FLINK_KAFKA, bundle_jars, has_bundle

    if not has_bundle(FLINK_KAFKA):
        pytest.skip("the Flink Kafka connector jar is not built (make setup)")
    names = set(zipfile.ZipFile(bundle_jars(FLINK_KAFKA)[0]).namelist())
    for module in (SHADED_PLAIN, SHADED_PLAIN.replace("plain.PlainLoginModule", "scram.ScramLoginModule")):
        assert module.replace(".", "/") + ".class" in names


@pytest.mark.parametrize(("properties", "expected"), [
    ({"security.protocol": "SSL", "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "pem",
      "ssl.keystore.location": "/me.pem", "ssl.keystore.type": "PEM", "ssl.key.password": "k",
      "ssl.endpoint.identification.algorithm": ""},
     {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/me.pem",
      "ssl.key.location": "/me.pem", "ssl.key.password": "k", "ssl.endpoint.identification.algorithm": "none"}),
    ({"ssl.keystore.location": "/me.p12", "ssl.keystore.type": "PKCS12", "ssl.keystore.password": "s",
      "ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----..."},
     {"ssl.keystore.location": "/me.p12", "ssl.keystore.password": "s", "ssl.ca.pem": "-----BEGIN CERTIFICATE-----..."}),
    ({"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
      "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                          'clientId="quiver" clientSecret="s3" scope="kafka";'},
     {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
      "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "quiver",
      "sasl.oauthbearer.client.secret": "s3", "sasl.oauthbearer.scope": "kafka"}),
    # librdkafka's own names win over a translation, and need none: a JKS truststore is then fine
    ({"ssl.truststore.location": "/ca.jks", "ssl.truststore.password": "x", "librdkafka.ssl.ca.location": "/ca.pem",
      "fetch.max.bytes": "1048576"},
     {"ssl.ca.location": "/ca.pem"}),
])
def test_librdkafka_gets_the_translated_settings(properties: dict[str, str], expected: dict[str, str]) -> None:
    assert KafkaSettings("a:9092", properties).client_config() == expected


@pytest.mark.parametrize(("properties", "message"), [
    ({"ssl.truststore.location": "/ca.jks"},
     "kafka.properties: ssl.truststore.location /ca.jks is a JKS truststore, which Quiver's Python clients "
     "(librdkafka) cannot read: give the CA certificates as a PEM file (ssl.truststore.type: PEM; Flink's Java "
     "client reads it too), or add librdkafka.ssl.ca.location: <a PEM file of the same CA>"),
    ({"ssl.keystore.location": "/me.jks", "ssl.keystore.type": "JKS"}, "/me.jks is a JKS keystore"),
    ({"sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;"},
     "kafka.properties: sasl.jaas.config uses com.sun.security.auth.module.Krb5LoginModule, which Quiver's Python "
     "clients (librdkafka: offsets, --fresh, the demo producer) cannot use; add librdkafka's own settings"),
    ({"sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler"},
     "sasl.client.callback.handler.class names software.amazon.msk.auth.iam.IAMClientCallbackHandler"),
    ({"sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\";"},
     "sasl.jaas.config (PlainLoginModule) has no password"),
    ({"sasl.jaas.config": "username=alice"}, "sasl.jaas.config is not a JAAS entry"),
])
def test_what_librdkafka_cannot_use_is_an_error_saying_what_to_give(properties: dict[str, str],
                                                                    message: str) -> None:
    with pytest.raises(QuiverError) as caught:
        librdkafka_settings(properties)
    assert message in str(caught.value)


def test_jaas_options_quoted_unquoted_and_escaped() -> None:
    module, options = parse_jaas('org.example.Login  required  debug=true  user="a b"  secret="x\\"y;z" ;', "where")
    assert module == "org.example.Login"
    assert options == {"debug": "true", "user": "a b", "secret": 'x"y;z'}


@pytest.mark.parametrize("suffix", ["", ", 1 identical error(s) suppressed"])
def test_librdkafka_error_text_is_trimmed_to_its_reason(suffix: str) -> None:
    from quiver.streaming.kafka_broker import _reason

    text = f"sasl_ssl://127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused " \
           f"(after 0ms in state CONNECT{suffix})"
    assert _reason(text) == "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
