"""Kafka client properties (quiver.yaml's `kafka.properties`): read, secrets taken from the environment, and
translated for the two clients Quiver runs against one cluster.

Users write the Java client's names (what MSK, Confluent Cloud and Strimzi document). Flink's Kafka SQL
connector gets them as they are, except that it shades the Kafka client: a class named in a value
(`org.apache.kafka.common.security.plain.PlainLoginModule` in `sasl.jaas.config`) must carry the shaded
prefix there. librdkafka (confluent-kafka: the runner's offset reader, `--fresh`, the demo producer) has its
own names; `librdkafka_settings` translates what has an equivalent and refuses, with the way out, what has
none (a JKS truststore). librdkafka's own names, or any name with the prefix `librdkafka.`, go to the Python
clients only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from quiver.catalog.errors import QuiverError

# Keys Quiver sets itself: a user's value would be overridden, or would silently change what a run means.
SET_BY_QUIVER: Mapping[str, str] = {
    "bootstrap.servers": "the brokers belong in the kafka section's bootstrap",
    "group.id": "the stream job's consumer groups are <group_prefix>.<source> (kafka.group_prefix)",
    "enable.auto.commit": "the stream job commits its offsets when a checkpoint completes",
    "auto.commit.interval.ms": "the stream job commits its offsets when a checkpoint completes",
    "auto.offset.reset": "where a run starts reading is its startup mode",
    "key.deserializer": "the connector reads the records' bytes itself",
    "value.deserializer": "the connector reads the records' bytes itself",
}
# Flink's Kafka connector shades the Kafka client under this prefix (flink-sql-connector-kafka's jar).
FLINK_SHADED_PREFIX = "org.apache.flink.kafka.shaded."
_KAFKA_CLASS = re.compile(r"(?<![\w.$])org\.apache\.kafka\.")
LIBRDKAFKA_PREFIX = "librdkafka."
# librdkafka's names with no Java twin: given by the user, they go to the Python clients only.
LIBRDKAFKA_NAMES = frozenset({
    "sasl.username", "sasl.password", "sasl.mechanisms", "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location",
    "ssl.certificate.pem", "ssl.key.location", "ssl.key.pem", "sasl.oauthbearer.method", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.config", "enable.ssl.certificate.verification",
})
# Java names librdkafka reads with the same meaning.
_SHARED = ("security.protocol", "sasl.mechanism", "sasl.kerberos.service.name", "client.id",
           "sasl.oauthbearer.token.endpoint.url")
_SECRET = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_JAAS = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'\s*([\w.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')


def kafka_property_values(raw: Any, where: str) -> dict[str, str]:
    """`raw` (a mapping of Kafka client property names to scalars, from YAML or code) as the properties the
    clients get, every value a string (true/false in lower case); a QuiverError naming `where` and the key
    otherwise. `${NAME}` stays as written: `resolve_secrets` fills it in where the clients are made."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuiverError(f"{where} must be a mapping of Kafka client properties to values, got {raw!r}")
    properties: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.strip() or key != key.strip():
            raise QuiverError(f"{where}: {key!r} is not a Kafka client property name")
        if key.startswith("properties."):
            raise QuiverError(f"{where}: {key}: write the Kafka client's own name, {key.removeprefix('properties.')} "
                              "(Quiver passes it to Flink's connector with its properties. prefix)")
        if key in SET_BY_QUIVER:
            raise QuiverError(f"{where}: {key} is set by Quiver: {SET_BY_QUIVER[key]}")
        properties[key] = setting_text(value, where, key)
    return properties


def setting_text(value: Any, where: str, key: str) -> str:
    """A client setting's YAML value as the JVM clients read it: text, a number's text, or true/false in lower
    case; a QuiverError naming `where` and `key` for anything else (a list, a mapping, null)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise QuiverError(f"{where}: {key} must be a string, a number or true/false, got {value!r}")


def parse_kafka_properties_env(text: str, variable: str) -> dict[str, str]:
    """QUIVER_KAFKA_PROPERTIES's value: `key=value` entries separated by commas (the value is everything after
    the first `=`, so a JAAS line fits; a value holding a comma belongs in quiver.yaml)."""
    return kafka_property_values(env_pairs(text, variable, "security.protocol=SASL_SSL,sasl.mechanism=SCRAM-SHA-512"),
                                 variable)


def env_pairs(text: str, variable: str, example: str) -> dict[str, str]:
    """An environment variable's `key=value` entries separated by commas (the value is everything after the
    first `=`); a QuiverError naming `variable`, with `example`, for an entry without one."""
    pairs: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep:
            raise QuiverError(f"{variable}: {entry!r} is not key=value (entries are key=value separated by commas, "
                              f"e.g. {example})")
        pairs[key.strip()] = value.strip()
    return pairs


def resolve_secrets(properties: Mapping[str, str], where: str,
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every `${NAME}` in a value replaced by the environment variable NAME (a password from a Kubernetes
    Secret); a variable that is not set is a QuiverError naming `where`, the key and the variable."""
    env = os.environ if environ is None else environ

    def resolved(key: str, value: str) -> str:
        def value_of(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise QuiverError(f"{where}: {key} refers to ${{{name}}}, but the environment variable {name} is "
                                  "not set (set it, e.g. from a Kubernetes Secret, where Quiver runs)")
            # Inside a JAAS entry the value sits between quotes: a password holding " or \ must stay one value.
            return re.sub(r'(["\\])', r"\\\1", env[name]) if key == "sasl.jaas.config" else env[name]

        return _SECRET.sub(value_of, value)

    return {key: resolved(key, value) for key, value in properties.items()}


def flink_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties for Flink's Kafka SQL connector (each becomes `properties.<key>` of the source table):
    the Java names as given, Kafka's class names moved under the connector's shaded prefix, librdkafka-only
    settings left out."""
    return {key: _KAFKA_CLASS.sub(FLINK_SHADED_PREFIX + "org.apache.kafka.", value)
            for key, value in sorted(properties.items())
            if key not in LIBRDKAFKA_NAMES and not key.startswith(LIBRDKAFKA_PREFIX)}


def parse_jaas(text: str, where: str) -> tuple[str, dict[str, str]]:
    """A one-entry JAAS configuration (`<LoginModule class> required key="value" …;`): the class and options."""
    match = _JAAS.match(text)
    if not match:
        raise QuiverError(f"{where}: sasl.jaas.config is not a JAAS entry such as "
                          'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";')
    options: dict[str, str] = {}
    rest = match.group(3)
    while rest.strip():
        option = _JAAS_OPTION.match(rest)
        if not option:
            raise QuiverError(f"{where}: sasl.jaas.config: cannot read the options after {match.group(1)} "
                              f"{match.group(2)} (expected key=\"value\" pairs, got {rest.strip()[:40]!r})")
        quoted, bare = option.group(2), option.group(3)
        options[option.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        rest = rest[option.end():]
    return match.group(1), options


def librdkafka_settings(properties: Mapping[str, str], where: str = "kafka.properties") -> dict[str, str]:
    """The properties translated for librdkafka: security.protocol and sasl.mechanism as they are, the
    username and password of a PLAIN or SCRAM `sasl.jaas.config`, an OAuth client's id/secret/scope, PEM
    truststores and keystores as librdkafka's CA/certificate/key files. A JKS store or a login module with
    no equivalent is a QuiverError saying what to give instead; librdkafka's own names win."""
    own = {k: v for k, v in properties.items() if k in LIBRDKAFKA_NAMES}
    own.update({k.removeprefix(LIBRDKAFKA_PREFIX): v for k, v in properties.items() if k.startswith(LIBRDKAFKA_PREFIX)})
    out = {k: properties[k] for k in _SHARED if k in properties}
    if not any(k in own for k in ("sasl.username", "sasl.password", "sasl.oauthbearer.method",
                                  "sasl.oauthbearer.config")):
        out.update(_sasl(properties, where))
    if not any(k in own for k in ("ssl.ca.location", "ssl.ca.pem")):
        out.update(_truststore(properties, where))
    if not any(k in own for k in ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")):
        out.update(_keystore(properties, where))
    if "ssl.endpoint.identification.algorithm" in properties:  # Java: "" turns the host name check off
        out["ssl.endpoint.identification.algorithm"] = properties["ssl.endpoint.identification.algorithm"] or "none"
    out.update(own)
    return out


def _cannot(where: str, what: str, example: str) -> QuiverError:
    return QuiverError(f"{where}: {what}, which Quiver's Python clients (librdkafka: offsets, --fresh, the demo "
                       f"producer) cannot use; add librdkafka's own settings for them under the prefix "
                       f"{LIBRDKAFKA_PREFIX} (e.g. {example})")


def _sasl(properties: Mapping[str, str], where: str) -> dict[str, str]:
    jaas = properties.get("sasl.jaas.config")
    if not jaas:
        for key in ("sasl.login.callback.handler.class", "sasl.client.callback.handler.class", "sasl.login.class"):
            if key in properties:
                raise _cannot(where, f"{key} names {properties[key]}", "librdkafka.sasl.oauthbearer.method: oidc")
        return {}
    module, options = parse_jaas(jaas, where)
    simple = module.rsplit(".", 1)[-1]
    if simple in ("PlainLoginModule", "ScramLoginModule"):
        missing = [k for k in ("username", "password") if k not in options]
        if missing:
            raise QuiverError(f"{where}: sasl.jaas.config ({simple}) has no {' and no '.join(missing)}")
        return {"sasl.username": options["username"], "sasl.password": options["password"]}
    if simple == "OAuthBearerLoginModule" and "clientId" in options:  # OAuth client credentials (KIP-768)
        oidc = {"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": options["clientId"],
                "sasl.oauthbearer.client.secret": options.get("clientSecret", "")}
        if "scope" in options:
            oidc["sasl.oauthbearer.scope"] = options["scope"]
        return oidc
    raise _cannot(where, f"sasl.jaas.config uses {module}", "librdkafka.sasl.oauthbearer.method: oidc, or "
                  "librdkafka.sasl.kerberos.keytab")


def _truststore(properties: Mapping[str, str], where: str) -> dict[str, str]:
    if "ssl.truststore.certificates" in properties:  # the CA certificates inline, PEM
        return {"ssl.ca.pem": properties["ssl.truststore.certificates"]}
    location = properties.get("ssl.truststore.location")
    if not location:
        return {}
    kind = properties.get("ssl.truststore.type", "JKS").upper()
    if kind != "PEM":
        raise QuiverError(f"{where}: ssl.truststore.location {location} is a {kind} truststore, which Quiver's "
                          "Python clients (librdkafka) cannot read: give the CA certificates as a PEM file "
                          "(ssl.truststore.type: PEM; Flink's Java client reads it too), or add "
                          f"{LIBRDKAFKA_PREFIX}ssl.ca.location: <a PEM file of the same CA>")
    return {"ssl.ca.location": location}


def _keystore(properties: Mapping[str, str], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if "ssl.keystore.certificate.chain" in properties or "ssl.keystore.key" in properties:  # inline PEM
        out = {"ssl.certificate.pem": properties.get("ssl.keystore.certificate.chain", ""),
               "ssl.key.pem": properties.get("ssl.keystore.key", "")}
    elif location := properties.get("ssl.keystore.location"):
        kind = properties.get("ssl.keystore.type", "JKS").upper()
        if kind == "PEM":  # one file: the private key and the certificate chain; OpenSSL finds each in it
            out = {"ssl.certificate.location": location, "ssl.key.location": location}
        elif kind == "PKCS12":
            out = {"ssl.keystore.location": location}
            if "ssl.keystore.password" in properties:
                out["ssl.keystore.password"] = properties["ssl.keystore.password"]
            return out
        else:
            raise QuiverError(f"{where}: ssl.keystore.location {location} is a {kind} keystore, which Quiver's "
                              "Python clients (librdkafka) cannot read: use a PEM keystore (ssl.keystore.type: PEM, "
                              "the private key and certificate chain in one file) or PKCS12")
    if out and "ssl.key.password" in properties:
        out["ssl.key.password"] = properties["ssl.key.password"]
    return out
