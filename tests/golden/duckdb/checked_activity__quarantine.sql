-- Quiver quarantine of feature view "checked_activity", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
WITH "checked" AS (
  SELECT *, CASE WHEN "user_id" IS NULL THEN 'not_null:user_id' WHEN isnan("amount") OR abs("amount") = CAST('Infinity' AS DOUBLE) THEN 'finite:amount' WHEN "amount" < CAST('1.0' AS DOUBLE) OR isnan("amount") THEN 'min:amount' WHEN "amount" > CAST('150.0' AS DOUBLE) OR isnan("amount") THEN 'max:amount' WHEN "qty" < CAST(-3 AS BIGINT) THEN 'min:qty' WHEN "qty" > CAST(5 AS BIGINT) THEN 'max:qty' WHEN "cat" NOT IN ('a', 'b', 'c') THEN 'one_of:cat' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) < CAST(1709186400000000 AS BIGINT) THEN 'min:ts' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) > $now_us + CAST(3600000000 AS BIGINT) THEN 'future:ts' END AS "__reason"
  FROM "checked_events"
)
SELECT
  CAST("user_id" AS BIGINT) AS "user_id",
  CAST("ts" AS TIMESTAMPTZ) AS "ts",
  CAST("amount" AS DOUBLE) AS "amount",
  CAST("qty" AS BIGINT) AS "qty",
  CAST("cat" AS VARCHAR) AS "cat",
  CASE WHEN "ts" IS NULL THEN 'null_event_ts' ELSE coalesce("__reason", 'null_key') END AS "quarantine_reason",
  CASE WHEN "__reason" IS NULL OR NOT ("__reason" = 'future:ts') THEN CAST(make_timestamp(epoch_us(CAST("ts" AS TIMESTAMP_NS))) AS DATE) END AS "__date"
FROM "checked"
WHERE "ts" IS NULL
   OR "__reason" = 'future:ts'
   OR ("ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us) AND ("__reason" IS NOT NULL OR "user_id" IS NULL))
