-- Quiver feature values of view "user_merchant" as of $as_of_us (tile-aligned) from its tiles; target duckdb.
WITH "merged" AS (
  SELECT
    "user_id",
    "merchant_id",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 1800000000 THEN "amount__cnt" END) AS BIGINT) AS "amount__cnt__w1800000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 1800000000 THEN "amount__sum" END) AS "amount__sum__w1800000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__cnt" END) AS BIGINT) AS "amount__cnt__w3600000000",
    struct_extract(max(CASE WHEN "amount__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "amount__last_ts", v := "amount__last") END), 'v') AS "amount__last__w3600000000",
    struct_extract(max(CASE WHEN "amount__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "amount__last_ts", v := "amount__last") END), 't') AS "amount__last_ts__w3600000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "qty__cnt" END) AS BIGINT) AS "qty__cnt__w3600000000",
    max(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "qty__max" END) AS "qty__max__w3600000000"
  FROM "tiles"
  WHERE "tile_start" >= $as_of_us - 3600000000 AND "tile_start" < $as_of_us
  GROUP BY "user_id", "merchant_id"
)
SELECT
  "user_id",
  "merchant_id",
  coalesce("amount__cnt__w1800000000", 0) AS "amount_count_30m",
  coalesce("amount__sum__w1800000000", 0) AS "amount_sum_30m",
  "amount__last__w3600000000" AS "amount_last_1h",
  "qty__max__w3600000000" AS "qty_max_1h"
FROM "merged"
ORDER BY "user_id", "merchant_id"
