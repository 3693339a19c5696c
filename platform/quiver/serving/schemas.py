"""Request and response bodies of the HTTP feature server (pydantic: validated, documented in OpenAPI)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

MAX_ENTITIES = 10_000
MAX_FEATURES = 2_000
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_REF = r"^[A-Za-z_][A-Za-z0-9_]{0,62}:[A-Za-z_][A-Za-z0-9_]{0,62}$"
_US_LIMIT = 2**62  # epoch µs far beyond any real time, and safe in int64 arithmetic
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FeatureRef = Annotated[str, Field(pattern=_REF, description="'view:feature'")]
KeyName = Annotated[str, Field(pattern=_IDENT)]
KeyValue = StrictInt | StrictStr | StrictBool


class OnlineRequest(BaseModel):
    """Which features, for which entities, as of when. Give `features` or `feature_service`, not both."""

    model_config = ConfigDict(extra="forbid")

    features: list[FeatureRef] | None = Field(None, min_length=1, max_length=MAX_FEATURES,
                                              examples=[["user_spend:amount_sum_1h"]])
    feature_service: Annotated[str, Field(pattern=_IDENT)] | None = Field(None, examples=["fraud_model"])
    entities: dict[KeyName, Annotated[list[KeyValue], Field(max_length=MAX_ENTITIES)]] = Field(
        min_length=1, max_length=16, description="join key → one value per entity", examples=[{"user_id": [7, 8]}])
    at: StrictStr | None = Field(
        None, description="request time as an ISO-8601 string with a UTC offset, e.g. 2026-11-03T12:00:00Z "
                          "(default: now); for epoch microseconds use `at_us`",
        examples=["2026-11-03T12:00:00Z"])
    at_us: Annotated[StrictInt, Field(ge=-_US_LIMIT, le=_US_LIMIT)] | None = Field(
        None, description="request time in epoch microseconds (instead of `at`)")
    full_feature_names: StrictBool = Field(False, description="name columns view__feature instead of feature")

    @field_validator("at")
    @classmethod
    def _iso_with_offset(cls, value: str | None) -> str | None:
        # One form only: a number's unit would depend on how it is written (1.5 s? 15 µs?), and a time
        # without an offset on the server's idea of local time.
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError("`at` must be an ISO-8601 time with a UTC offset, e.g. 2026-11-03T12:00:00Z "
                             "(epoch microseconds go in `at_us`)") from None
        if parsed.tzinfo is None:
            raise ValueError("`at` needs a UTC offset (…Z or …+01:00): a time without one is ambiguous")
        return value

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
        if self.at is None:
            return None
        parsed = datetime.fromisoformat(self.at.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        delta = parsed - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


Status = Literal["PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"]


class OnlineResponse(BaseModel):
    """Feature values in request order; null where a value is missing, expired or undefined, and for every
    value its status: PRESENT, NULL_VALUE (the row is there, the feature is null), NOT_FOUND (nothing stored
    for the entity) or OUTSIDE_MAX_AGE (older than the view's TTL)."""

    at: int | list[int] = Field(description="request time(s), epoch microseconds")
    entities: dict[str, list[KeyValue]]
    features: dict[str, list[float | int | str | bool | None]]
    status: dict[str, list[Status]] = Field(description="per feature, the status of each value")
