-- Quiver quarantine of feature view "user_merchant", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
SELECT
  CAST("user_id" AS BIGINT) AS "user_id",
  CAST("merchant_id" AS BIGINT) AS "merchant_id",
  CAST("ts" AS TIMESTAMPTZ) AS "ts",
  CAST("amount" AS DOUBLE) AS "amount",
  CAST("qty" AS BIGINT) AS "qty",
  CASE WHEN "ts" IS NULL THEN 'null_event_ts' ELSE 'null_key' END AS "quarantine_reason",
  CAST(make_timestamp(epoch_us(CAST("ts" AS TIMESTAMP_NS))) AS DATE) AS "__date"
FROM "events"
WHERE "ts" IS NULL
   OR ("ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us) AND ("user_id" IS NULL OR "merchant_id" IS NULL))
