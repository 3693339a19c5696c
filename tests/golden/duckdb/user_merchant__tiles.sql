-- Quiver tiles of feature view "user_merchant", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
WITH "events" AS (
  SELECT
    CAST("user_id" AS BIGINT) AS "user_id",
    CAST("merchant_id" AS BIGINT) AS "merchant_id",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) AS "__ts_us",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) - ((epoch_us(CAST("ts" AS TIMESTAMP_NS)) % 600000000) + 600000000) % 600000000 AS "tile_start",
    CAST("amount" AS DOUBLE) AS "amount",
    CAST("qty" AS BIGINT) AS "qty"
  FROM "events"
  WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us)
    AND "user_id" IS NOT NULL AND "merchant_id" IS NOT NULL
), "tiles" AS (
  SELECT
    "user_id",
    "merchant_id",
    "tile_start",
    count(*) AS "n_events",
    count("amount") AS "amount__cnt",
    sum("amount") AS "amount__sum",
    max(CASE WHEN "amount" IS NOT NULL THEN struct_pack(t := "__ts_us", v := "amount") END) AS "amount__last",
    count("qty") AS "qty__cnt",
    max("qty") AS "qty__max"
  FROM "events"
  GROUP BY "user_id", "merchant_id", "tile_start"
)
SELECT
  "user_id",
  "merchant_id",
  "tile_start",
  "n_events",
  "amount__cnt",
  "amount__sum",
  struct_extract("amount__last", 'v') AS "amount__last",
  struct_extract("amount__last", 't') AS "amount__last_ts",
  "qty__cnt",
  "qty__max",
  CAST(make_timestamp("tile_start") AS DATE) AS "__date"
FROM "tiles"
ORDER BY "__date", "user_id", "merchant_id", "tile_start"
