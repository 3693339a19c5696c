"""Alerts: records in the registry (deduplicated, never lost) delivered to pluggable sinks.

Every sink implements one method, `send(alert) -> attempts`, and raises `DeliveryError` when it gives up.
`AlertManager.raise_alert` commits the alert (or bumps the open one with the same kind and subject) *before*
delivering, then records per sink `delivered` or `failed` with the attempts used; `redeliver()` retries the
failed and pending ones later (e.g. from the scheduler).

Sinks here (configured under `alert_sinks:` in monitoring.yaml; the format is in docs/configuration.md):
* `LogSink` — a log line (level by severity).
* `WebhookSink` — POSTs Slack-compatible JSON {"text", "blocks"}; retries connection errors, timeouts, 429
  and 5xx with exponential backoff (honouring Retry-After); other 4xx fail at once (retrying cannot help).
* `AirflowAssetSink` — tells the retrain DAG of `retrain_needed` alerts (by default; drift alone warns).
  With `api_url` it records an asset event through Airflow 3.3's REST API (`POST /api/v2/assets/events`,
  asset looked up by URI, bearer token or /auth/token login). Without one (the default here: no Airflow API
  server runs in this setup) it writes a JSON trigger file,
  `<trigger_dir>/<asset>.json`, atomically: a DAG scheduled on an `Asset` watched by
  `AssetWatcher(trigger=FileDeleteTrigger(filepath=...))` fires and deletes it; every event is also kept
  under `<trigger_dir>/<asset>.events/`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from quiver.monitoring import repository
from quiver.monitoring.repository import SEVERITIES, AlertRecord
from quiver.registry import Registry

Alert = AlertRecord
log = logging.getLogger("quiver.alerts")


class DeliveryError(Exception):
    """A sink gave up on an alert after `attempts` tries."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


@runtime_checkable
class AlertSink(Protocol):
    """Somewhere alerts go. `name` keys its delivery records; `send` returns the attempts it used."""

    name: str

    def send(self, alert: Alert) -> int: ...


class LogSink:
    """Alerts as log records on the `quiver.alerts` logger."""

    def __init__(self, name: str = "log", logger: logging.Logger | None = None):
        self.name = name
        self.logger = logger or log

    def send(self, alert: Alert) -> int:
        level = {"info": logging.INFO, "warning": logging.WARNING}.get(alert.severity, logging.ERROR)
        self.logger.log(level, "[%s] %s (%s %s, seen %d×): %s", alert.severity, alert.title, alert.kind,
                        alert.subject, alert.occurrences, alert.message)
        return 1


def slack_payload(alert: Alert) -> dict[str, Any]:
    """Slack-compatible message: a plain `text` fallback plus Block Kit `blocks`."""
    icon = {"info": ":information_source:", "warning": ":warning:"}.get(alert.severity, ":rotating_light:")
    text = f"{icon} [{alert.severity.upper()}] {alert.title}"
    fields = [f"*Kind:* {alert.kind}", f"*Subject:* {alert.subject}", f"*Project:* {alert.project}",
              f"*Seen:* {alert.occurrences}×"]
    return {
        "text": text,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": f"{alert.title}"[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": alert.message[:2900] or text}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
                f"alert #{alert.id} · opened {alert.created_at:%Y-%m-%d %H:%M:%S} UTC · quiver"}]},
        ],
    }


class WebhookSink:
    """POST Slack-compatible JSON to a URL, with retries and exponential backoff."""

    def __init__(self, url: str, name: str = "webhook", *, attempts: int = 4, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, timeout_s: float = 5.0, headers: Mapping[str, str] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.url, self.name = url, name
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.timeout_s, self.headers, self.sleep = timeout_s, dict(headers or {}), sleep

    def send(self, alert: Alert) -> int:
        body = json.dumps(slack_payload(alert)).encode()
        delay, error = self.backoff_s, ""
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json", **self.headers})
            retry_after: float | None = None
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
                return attempt
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code} from {self.url}"
                if exc.code != 429 and exc.code < 500:
                    raise DeliveryError(error, attempt) from None
                retry_after = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            if attempt < self.attempts:
                self.sleep(min(retry_after if retry_after is not None else delay, self.max_backoff_s))
                delay = min(delay * 2, self.max_backoff_s)
        raise DeliveryError(f"gave up after {self.attempts} attempts: {error}", self.attempts)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class AirflowAssetSink:
    """Emit an Airflow Asset event for alerts that should trigger retraining (see the module docstring)."""

    def __init__(self, asset_uri: str = "quiver://monitoring/drift", *, name: str = "airflow_asset",
                 trigger_dir: str | Path | None = None, api_url: str | None = None, token: str | None = None,
                 username: str | None = None, password: str | None = None,
                 kinds: Sequence[str] = ("retrain_needed",), min_severity: str = "warning",
                 timeout_s: float = 10.0):
        if api_url is None and trigger_dir is None:
            raise ValueError("AirflowAssetSink needs api_url (Airflow REST API) or trigger_dir (trigger files)")
        self.asset_uri, self.name, self.api_url = asset_uri, name, api_url.rstrip("/") if api_url else None
        self.trigger_dir = Path(trigger_dir) if trigger_dir else None
        self.token, self.username, self.password = token, username, password
        self.kinds, self.min_severity, self.timeout_s = tuple(kinds), min_severity, timeout_s

    @property
    def asset_name(self) -> str:
        parsed = urllib.parse.urlparse(self.asset_uri)
        raw = (parsed.netloc + parsed.path) if parsed.scheme else self.asset_uri
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw).strip("_") or "asset"

    @property
    def trigger_file(self) -> Path | None:
        return self.trigger_dir / f"{self.asset_name}.json" if self.trigger_dir else None

    def wants(self, alert: Alert) -> bool:
        return (alert.kind in self.kinds
                and SEVERITIES.index(alert.severity) >= SEVERITIES.index(self.min_severity))

    def send(self, alert: Alert) -> int:
        if not self.wants(alert):
            return 1  # not a retraining signal: nothing to emit, nothing to retry
        extra = {"alert_id": alert.id, "kind": alert.kind, "subject": alert.subject, "severity": alert.severity,
                 "title": alert.title, "project": alert.project, "detail": alert.detail,
                 "emitted_at": datetime.now(UTC).isoformat()}
        if self.api_url:
            self._post_event(extra)
        else:
            self._write_trigger(extra)
        return 1

    def _write_trigger(self, extra: dict[str, Any]) -> None:
        assert self.trigger_dir is not None and self.trigger_file is not None
        events = self.trigger_dir / f"{self.asset_name}.events"
        events.mkdir(parents=True, exist_ok=True)
        blob = json.dumps({"asset_uri": self.asset_uri, "extra": extra}, default=str, indent=2)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        for target in (events / f"{stamp}-alert{extra['alert_id']}.json", self.trigger_file):
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(blob)
            os.replace(tmp, target)

    def _post_event(self, extra: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._token()}"}
        query = urllib.parse.urlencode({"uri_pattern": self.asset_uri})
        found = self._request("GET", f"/api/v2/assets?{query}", None, headers)
        matches = [a for a in found.get("assets", []) if a.get("uri") == self.asset_uri]
        if not matches:
            raise DeliveryError(f"Airflow has no asset with uri {self.asset_uri!r} (is the DAG deployed?)")
        self._request("POST", "/api/v2/assets/events", {"asset_id": matches[0]["id"], "extra": extra}, headers)

    def _token(self) -> str:
        if self.token:
            return self.token
        if not (self.username and self.password):
            raise DeliveryError("Airflow API needs token= or username= and password=")
        reply = self._request("POST", "/auth/token", {"username": self.username, "password": self.password},
                              {"Content-Type": "application/json"})
        return str(reply["access_token"])

    def _request(self, method: str, path: str, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api_url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            raise DeliveryError(f"Airflow API {method} {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise DeliveryError(f"Airflow API {method} {path}: {exc}") from None
        return dict(json.loads(text))


@dataclass(frozen=True)
class RaisedAlert:
    """What `raise_alert` did: the stored alert and whether it was created, escalated or repeated."""

    alert: Alert
    outcome: str  # created | escalated | repeated

    @property
    def notified(self) -> bool:
        return self.outcome != "repeated"


class AlertManager:
    """Raise, deduplicate, deliver and resolve alerts of one registry project."""

    def __init__(self, registry: Registry, sinks: Sequence[AlertSink] = ()):
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        self.registry = registry
        self.sinks = {s.name: s for s in sinks}

    def raise_alert(self, kind: str, subject: str, severity: str, title: str, message: str = "",
                    detail: dict[str, Any] | None = None) -> RaisedAlert:
        """Record the alert (one open per kind+subject), then deliver it when it is new or escalated."""
        record, outcome = repository.open_alert(self.registry, kind, subject, severity, title, message, detail,
                                                list(self.sinks))
        from quiver import metrics

        metrics.ALERTS.labels(kind=kind, severity=severity, outcome=outcome).inc()
        if outcome != "repeated":
            self.deliver(record.id)
            record = repository.get_alert(self.registry, record.id)
        return RaisedAlert(record, outcome)

    def deliver(self, alert_id: int) -> int:
        """Send `alert_id` to every sink whose delivery is still open (e.g. an alert recorded inside a
        decision's transaction); each delivery is claimed first, so it is sent once however many callers
        try. Returns how many were delivered now."""
        alert = repository.get_alert(self.registry, alert_id)
        delivered = 0
        for name, state in alert.deliveries.items():
            sink = self.sinks.get(name)
            if sink is not None and state != "delivered" and repository.claim_delivery(self.registry, alert_id, name):
                delivered += self._deliver(alert, sink)
        return delivered

    def _deliver(self, alert: Alert, sink: AlertSink) -> bool:
        from quiver.monitoring import faults

        try:
            faults.point("alert.claimed")  # a death here leaves the claim to expire (redeliver's lease)
            attempts = sink.send(alert)
        except DeliveryError as exc:
            log.warning("alert %s not delivered to %s: %s", alert.id, sink.name, exc)
            repository.record_delivery(self.registry, alert.id, sink.name, False, exc.attempts, str(exc))
        except Exception as exc:  # a broken sink must not lose the alert or stop the other sinks
            log.exception("sink %s crashed on alert %s", sink.name, alert.id)
            repository.record_delivery(self.registry, alert.id, sink.name, False, 1,
                                       f"{type(exc).__name__}: {exc}")
        else:
            repository.record_delivery(self.registry, alert.id, sink.name, True, attempts)
            return True
        from quiver import metrics

        metrics.ALERT_DELIVERY_FAILURES.labels(sink=sink.name).inc()
        return False

    def redeliver(self, lease_s: float = 300.0) -> int:
        """Retry every pending or failed delivery to a configured sink, and every claim older than `lease_s`
        (its sender died); returns how many succeeded now."""
        delivered = 0
        for alert_id, sink_name in repository.undelivered(self.registry):
            sink = self.sinks.get(sink_name)
            if sink is not None and repository.claim_delivery(self.registry, alert_id, sink_name, lease_s):
                delivered += self._deliver(repository.get_alert(self.registry, alert_id), sink)
        return delivered

    def resolve(self, kind: str, subject: str | None = None, reason: str = "resolved") -> int:
        """Resolve the open alert(s) of `kind` (and `subject`), saying why in their history; a later
        occurrence opens a new alert."""
        return repository.resolve_alerts(self.registry, kind, subject, reason=reason)

    def open_alerts(self, kind: str | None = None) -> list[Alert]:
        return repository.list_alerts(self.registry, "open", kind)


def resolve_for_new_champion(registry: Registry, model: str, new_label: str,
                             as_of: datetime | None = None) -> int:
    """At promotion: resolve `model`'s open drift alerts judged against any other version than `new_label`
    (e.g. "fraud_model:3"), each with "the model changed: <old> → <new>" in its history; the new champion's
    own drift check raises its own. `as_of`: the data time of the promotion. Returns how many were resolved.
    Inside a caller's transaction: `repository.resolve_model_changed_in(..., keep_unlabelled=False)`."""
    with registry._write() as connection:
        return repository.resolve_model_changed_in(connection, registry.project, model, new_label,
                                                   keep_unlabelled=False, as_of=as_of)


def sinks_from_config(entries: Sequence[Mapping[str, Any]]) -> list[AlertSink]:
    """Build sinks from plain settings, e.g. [{"type": "webhook", "url": "https://hooks.slack.com/…"}]."""
    factories: dict[str, Callable[..., AlertSink]] = {
        "log": LogSink, "webhook": WebhookSink, "airflow_asset": AirflowAssetSink}
    sinks: list[AlertSink] = []
    for entry in entries:
        options = dict(entry)
        kind = options.pop("type", None)
        if kind not in factories:
            raise ValueError(f"unknown alert sink type {kind!r}; known: {', '.join(factories)}")
        sinks.append(factories[kind](**options))
    return sinks
