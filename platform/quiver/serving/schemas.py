"""Request and response bodies of the HTTP feature server (pydantic: validated, documented in OpenAPI)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

MAX_ENTITIES = 10_000
MAX_FEATURES = 2_000
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_REF = r"^[A-Za-z_][A-Za-z0-9_]{0,62}:[A-Za-z_][A-Za-z0-9_]{0,62}$"
_US_LIMIT = 2**62  # epoch µs far beyond any real time, and safe in int64 arithmetic

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
    at: Annotated[int, Field(ge=-_US_LIMIT, le=_US_LIMIT)] | datetime | None = Field(
        None, description="request time: epoch microseconds or ISO-8601 (default: now)")
    full_feature_names: bool = Field(False, description="name columns view__feature instead of feature")

    @model_validator(mode="after")
    def _one_selection(self) -> OnlineRequest:
        if (self.features is None) == (self.feature_service is None):
            raise ValueError("give exactly one of `features` or `feature_service`")
        return self


class OnlineResponse(BaseModel):
    """Feature values in request order; null where a value is missing, expired or undefined."""

    at: int | list[int] = Field(description="request time(s), epoch microseconds")
    entities: dict[str, list[KeyValue]]
    features: dict[str, list[float | int | str | bool | None]]
