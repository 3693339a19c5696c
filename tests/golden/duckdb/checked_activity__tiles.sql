-- Quiver tiles of feature view "checked_activity", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
WITH "events" AS (
  SELECT
    CAST("user_id" AS BIGINT) AS "user_id",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) AS "__ts_us",
    epoch_us(CAST("ts" AS TIMESTAMP_NS)) - ((epoch_us(CAST("ts" AS TIMESTAMP_NS)) % 300000000) + 300000000) % 300000000 AS "tile_start",
    CAST("amount" AS DOUBLE) AS "amount",
    CAST("qty" AS BIGINT) AS "qty"
  FROM "checked_events"
  WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us)
    AND "user_id" IS NOT NULL
    AND CASE WHEN "user_id" IS NULL THEN 'not_null:user_id' WHEN isnan("amount") OR abs("amount") = CAST('Infinity' AS DOUBLE) THEN 'finite:amount' WHEN "amount" < CAST('1.0' AS DOUBLE) OR isnan("amount") THEN 'min:amount' WHEN "amount" > CAST('150.0' AS DOUBLE) OR isnan("amount") THEN 'max:amount' WHEN "qty" < CAST(-3 AS BIGINT) THEN 'min:qty' WHEN "qty" > CAST(5 AS BIGINT) THEN 'max:qty' WHEN "cat" NOT IN ('a', 'b', 'c') THEN 'one_of:cat' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) < CAST(1709186400000000 AS BIGINT) THEN 'min:ts' WHEN epoch_us(CAST("ts" AS TIMESTAMP_NS)) > $now_us + CAST(3600000000 AS BIGINT) THEN 'future:ts' END IS NULL
), "tiles" AS (
  SELECT
    "user_id",
    "tile_start",
    count(*) AS "n_events",
    count("amount") AS "amount__cnt",
    sum("amount") AS "amount__sum",
    min("amount") AS "amount__min",
    max("amount") AS "amount__max",
    max(CASE WHEN "amount" IS NOT NULL THEN struct_pack(t := "__ts_us", v := "amount") END) AS "amount__last",
    sum("amount" * "amount") AS "amount__sumsq",
    count("qty") AS "qty__cnt",
    sum(CAST("qty" AS DOUBLE)) AS "qty__sum"
  FROM "events"
  GROUP BY "user_id", "tile_start"
)
SELECT
  "user_id",
  "tile_start",
  "n_events",
  "amount__cnt",
  "amount__sum",
  "amount__min",
  "amount__max",
  struct_extract("amount__last", 'v') AS "amount__last",
  struct_extract("amount__last", 't') AS "amount__last_ts",
  "amount__sumsq",
  "qty__cnt",
  "qty__sum",
  CAST(make_timestamp("tile_start") AS DATE) AS "__date"
FROM "tiles"
ORDER BY "__date", "user_id", "tile_start"
