-- Quiver last_values of feature view "user_last", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
WITH "events" AS (
  SELECT
    CAST("user_id" AS BIGINT) AS "user_id",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) AS "__ts_us",
    CAST("amount" AS DOUBLE) AS "amount",
    CAST("qty" AS BIGINT) AS "qty",
    CAST("flag" AS BOOLEAN) AS "flag",
    CAST("cat" AS VARCHAR) AS "cat",
    CAST("merchant_id" AS BIGINT) AS "last_merchant"
  FROM "events"
  WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us)
    AND "user_id" IS NOT NULL
), "ranked" AS (
  SELECT *, row_number() OVER (PARTITION BY "user_id", "__ts_us" ORDER BY "amount" DESC NULLS LAST, "qty" DESC NULLS LAST, "flag" DESC NULLS LAST, "cat" DESC NULLS LAST, "last_merchant" DESC NULLS LAST) AS "__rank"
  FROM "events"
)
SELECT
  "user_id",
  make_timestamptz("__ts_us") AS "event_ts",
  "amount",
  "qty",
  "flag",
  "cat",
  "last_merchant",
  CAST(make_timestamp("__ts_us") AS DATE) AS "__date"
FROM "ranked"
WHERE "__rank" = 1
ORDER BY "__date", "user_id", "event_ts"
