-- Quiver last_values of feature view "checked_last", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
WITH "events" AS (
  SELECT
    CAST("merchant_id" AS BIGINT) AS "merchant_id",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) AS "__ts_us",
    CAST("amount" AS DOUBLE) AS "amount",
    CAST("flag" AS BOOLEAN) AS "flag"
  FROM "checked_events"
  WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us)
    AND "merchant_id" IS NOT NULL
    AND CASE WHEN "user_id" IS NULL THEN 'not_null:user_id' WHEN isnan("amount") OR abs("amount") = CAST('Infinity' AS DOUBLE) THEN 'finite:amount' WHEN "amount" < CAST('1.0' AS DOUBLE) OR isnan("amount") THEN 'min:amount' WHEN "amount" > CAST('150.0' AS DOUBLE) OR isnan("amount") THEN 'max:amount' WHEN "qty" < CAST(-3 AS BIGINT) THEN 'min:qty' WHEN "qty" > CAST(5 AS BIGINT) THEN 'max:qty' WHEN "cat" NOT IN ('a', 'b', 'c') THEN 'one_of:cat' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) < CAST(1709186400000000 AS BIGINT) THEN 'min:ts' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) > $now_us + CAST(3600000000 AS BIGINT) THEN 'future:ts' END IS NULL
), "ranked" AS (
  SELECT *, row_number() OVER (PARTITION BY "merchant_id", "__ts_us" ORDER BY "amount" DESC NULLS LAST, "flag" DESC NULLS LAST) AS "__rank"
  FROM "events"
)
SELECT
  "merchant_id",
  make_timestamptz("__ts_us") AS "event_ts",
  "amount",
  "flag",
  CAST(make_timestamp("__ts_us") AS DATE) AS "__date"
FROM "ranked"
WHERE "__rank" = 1
ORDER BY "__date", "merchant_id", "event_ts"
