-- Quiver feature values of view "user_activity" as of $as_of_us (tile-aligned) from its tiles; target duckdb.
WITH "merged" AS (
  SELECT
    "user_id",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__cnt" END) AS BIGINT) AS "amount__cnt__w3600000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__sum" END) AS "amount__sum__w3600000000",
    min(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__min" END) AS "amount__min__w3600000000",
    max(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__max" END) AS "amount__max__w3600000000",
    struct_extract(max(CASE WHEN "amount__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "amount__last_ts", v := "amount__last") END), 'v') AS "amount__last__w3600000000",
    struct_extract(max(CASE WHEN "amount__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "amount__last_ts", v := "amount__last") END), 't') AS "amount__last_ts__w3600000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "amount__sumsq" END) AS "amount__sumsq__w3600000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "flag__cnt" END) AS BIGINT) AS "flag__cnt__w3600000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "flag__sum" END) AS "flag__sum__w3600000000",
    min(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "flag__min" END) AS "flag__min__w3600000000",
    max(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "flag__max" END) AS "flag__max__w3600000000",
    struct_extract(max(CASE WHEN "flag__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "flag__last_ts", v := "flag__last") END), 'v') AS "flag__last__w3600000000",
    struct_extract(max(CASE WHEN "flag__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 3600000000) THEN struct_pack(t := "flag__last_ts", v := "flag__last") END), 't') AS "flag__last_ts__w3600000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "flag__sumsq" END) AS "flag__sumsq__w3600000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 3600000000 THEN "cat__cnt" END) AS BIGINT) AS "cat__cnt__w3600000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "amount__cnt" END) AS BIGINT) AS "amount__cnt__w7200000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "amount__sum" END) AS "amount__sum__w7200000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "qty__cnt" END) AS BIGINT) AS "qty__cnt__w7200000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "qty__sum" END) AS "qty__sum__w7200000000",
    min(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "qty__min" END) AS "qty__min__w7200000000",
    max(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "qty__max" END) AS "qty__max__w7200000000",
    struct_extract(max(CASE WHEN "qty__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 7200000000) THEN struct_pack(t := "qty__last_ts", v := "qty__last") END), 'v') AS "qty__last__w7200000000",
    struct_extract(max(CASE WHEN "qty__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 7200000000) THEN struct_pack(t := "qty__last_ts", v := "qty__last") END), 't') AS "qty__last_ts__w7200000000",
    sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "qty__sumsq" END) AS "qty__sumsq__w7200000000",
    CAST(sum(CASE WHEN "tile_start" >= $as_of_us - 7200000000 THEN "cat__cnt" END) AS BIGINT) AS "cat__cnt__w7200000000",
    struct_extract(max(CASE WHEN "cat__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 7200000000) THEN struct_pack(t := "cat__last_ts", v := "cat__last") END), 'v') AS "cat__last__w7200000000",
    struct_extract(max(CASE WHEN "cat__last_ts" IS NOT NULL AND ("tile_start" >= $as_of_us - 7200000000) THEN struct_pack(t := "cat__last_ts", v := "cat__last") END), 't') AS "cat__last_ts__w7200000000"
  FROM "tiles"
  WHERE "tile_start" >= $as_of_us - 7200000000 AND "tile_start" < $as_of_us
  GROUP BY "user_id"
)
SELECT
  "user_id",
  coalesce("amount__cnt__w3600000000", 0) AS "amount_count_1h",
  coalesce("amount__sum__w3600000000", 0) AS "amount_sum_1h",
  CASE WHEN "amount__cnt__w3600000000" > 0 THEN "amount__sum__w3600000000" / "amount__cnt__w3600000000" END AS "amount_mean_1h",
  "amount__min__w3600000000" AS "amount_min_1h",
  "amount__max__w3600000000" AS "amount_max_1h",
  "amount__last__w3600000000" AS "amount_last_1h",
  CASE WHEN "amount__cnt__w3600000000" >= 2 THEN sqrt(greatest(("amount__sumsq__w3600000000" - "amount__sum__w3600000000" * "amount__sum__w3600000000" / "amount__cnt__w3600000000") / ("amount__cnt__w3600000000" - 1), 0)) END AS "amount_stddev_1h",
  coalesce("amount__sum__w7200000000", 0) AS "amount_sum_2h",
  coalesce("qty__cnt__w7200000000", 0) AS "qty_count_2h",
  coalesce("qty__sum__w7200000000", 0) AS "qty_sum_2h",
  CASE WHEN "qty__cnt__w7200000000" > 0 THEN "qty__sum__w7200000000" / "qty__cnt__w7200000000" END AS "qty_mean_2h",
  "qty__min__w7200000000" AS "qty_min_2h",
  "qty__max__w7200000000" AS "qty_max_2h",
  "qty__last__w7200000000" AS "qty_last_2h",
  CASE WHEN "qty__cnt__w7200000000" >= 2 THEN sqrt(greatest(("qty__sumsq__w7200000000" - "qty__sum__w7200000000" * "qty__sum__w7200000000" / "qty__cnt__w7200000000") / ("qty__cnt__w7200000000" - 1), 0)) END AS "qty_stddev_2h",
  coalesce("flag__cnt__w3600000000", 0) AS "flag_count_1h",
  coalesce("flag__sum__w3600000000", 0) AS "flag_sum_1h",
  CASE WHEN "flag__cnt__w3600000000" > 0 THEN "flag__sum__w3600000000" / "flag__cnt__w3600000000" END AS "flag_mean_1h",
  "flag__min__w3600000000" AS "flag_min_1h",
  "flag__max__w3600000000" AS "flag_max_1h",
  CAST("flag__last__w3600000000" AS BOOLEAN) AS "flag_last_1h",
  CASE WHEN "flag__cnt__w3600000000" >= 2 THEN sqrt(greatest(("flag__sumsq__w3600000000" - "flag__sum__w3600000000" * "flag__sum__w3600000000" / "flag__cnt__w3600000000") / ("flag__cnt__w3600000000" - 1), 0)) END AS "flag_stddev_1h",
  coalesce("cat__cnt__w3600000000", 0) AS "cat_count_1h",
  "cat__last__w7200000000" AS "cat_last_2h"
FROM "merged"
ORDER BY "user_id"
