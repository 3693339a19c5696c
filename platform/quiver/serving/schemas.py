"""Request and response bodies of the HTTP feature server (pydantic: validated, documented in OpenAPI)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr, model_validator

from quiver.online.base import TIME_RANGE
from quiver.serving.times import EpochMicros, IsoTime, iso_time_us, whole_number

MAX_ENTITIES = 10_000
MAX_FEATURES = 2_000
IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_REF = r"^[A-Za-z_][A-Za-z0-9_]{0,62}:[A-Za-z_][A-Za-z0-9_]{0,62}$"

FeatureRef = Annotated[str, Field(pattern=_REF, description="'view:feature'")]
KeyName = Annotated[str, Field(pattern=IDENT)]
# Join-key values: integers, text or booleans. Integers within ±(2^53 − 1), the range RFC 8259 (§6) says JSON
# implementations agree on; a larger integer key (up to int64) goes as a string of digits, which an int64 key
# reads exactly. Beyond int64 is an error, never a key wrapped around.
INT_LIMIT = 2**53 - 1
Int64 = Annotated[int, Field(ge=-INT_LIMIT, le=INT_LIMIT), BeforeValidator(whole_number)]
KeyValue = Int64 | StrictStr | StrictBool
# Only keys matching the pattern: `patternProperties` alone would let any other key through the schema.
KEYS_SCHEMA: dict[str, Any] = {"additionalProperties": False, "propertyNames": {"pattern": IDENT}}


def _one_of(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [{"required": ["features"], "not": {"required": ["feature_service"]}},
                       {"required": ["feature_service"], "not": {"required": ["features"]}}]
    schema["not"] = {"required": ["at", "at_us"]}
    for name in ("features", "feature_service", "at", "at_us"):  # absent, never null (see the field types)
        schema["properties"][name].pop("default", None)


class OnlineRequest(BaseModel):
    """Which features, for which entities, as of when. Give `features` or `feature_service`, not both."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_of)

    # Not Optional: an explicit null is a 422 (the schema says array / string); absent means "not given".
    features: Annotated[list[FeatureRef], Field(min_length=1, max_length=MAX_FEATURES)] = Field(
        None, examples=[["user_spend:amount_sum_1h"]])  # type: ignore[assignment,arg-type]
    feature_service: Annotated[str, Field(pattern=IDENT)] = Field(
        None, examples=["fraud_model"])  # type: ignore[assignment,arg-type]
    entities: dict[KeyName, Annotated[list[KeyValue], Field(max_length=MAX_ENTITIES)]] = Field(
        min_length=1, max_length=16, description="join key → one value per entity", examples=[{"user_id": [7, 8]}],
        json_schema_extra=KEYS_SCHEMA)
    at: IsoTime = Field(  # type: ignore[assignment]
        None, description=f"request time as an ISO-8601 string with a UTC offset, e.g. 2026-11-03T12:00:00Z "
                          f"(default: now), {TIME_RANGE}; for epoch microseconds use `at_us`",
        examples=["2026-11-03T12:00:00Z"])
    at_us: EpochMicros = Field(  # type: ignore[assignment]
        None, description=f"request time in epoch microseconds (instead of `at`), {TIME_RANGE}")
    full_feature_names: StrictBool = Field(False, description="name columns view__feature instead of feature")
    request: dict[KeyName, Annotated[list[Any], Field(max_length=MAX_ENTITIES)]] = Field(
        default_factory=dict, description="request fields on-demand features read: field → one value per entity",
        examples=[{"amount": [42.5, 9.99], "is_online": [True, False]}], json_schema_extra=KEYS_SCHEMA)

    @model_validator(mode="after")
    def _one_selection(self) -> OnlineRequest:
        if (self.features is None) == (self.feature_service is None):
            raise ValueError("give exactly one of `features` or `feature_service`")
        if self.at is not None and self.at_us is not None:
            raise ValueError("give at most one of `at` (ISO-8601) or `at_us` (epoch microseconds)")
        return self

    def at_us_value(self) -> int | None:
        """The request time in epoch µs, None for now."""
        if self.at_us is not None:
            return self.at_us
        return None if self.at is None else iso_time_us(self.at)


Status = Literal["PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"]


class OnlineResponse(BaseModel):
    """Feature values in request order; null where a value is missing, expired or undefined, and for every
    value its status: PRESENT, NULL_VALUE (the row is there, the feature is null), NOT_FOUND (nothing stored
    for the entity) or OUTSIDE_MAX_AGE (older than the view's TTL)."""

    at: int | list[int] = Field(description="request time(s), epoch microseconds")
    entities: dict[str, list[KeyValue]]
    features: dict[str, list[float | int | str | bool | None]]
    status: dict[str, list[Status]] = Field(description="per feature, the status of each value")
