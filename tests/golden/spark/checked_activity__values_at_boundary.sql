-- Quiver feature values of view `checked_activity` as of :as_of_us (tile-aligned) from its tiles; target spark.
WITH `merged` AS (
  SELECT
    `user_id`,
    CAST(sum(CASE WHEN `tile_start` >= :as_of_us - 3600000000 THEN `amount__cnt` END) AS BIGINT) AS `amount__cnt__w3600000000`,
    sum(CASE WHEN `tile_start` >= :as_of_us - 3600000000 THEN `amount__sum` END) AS `amount__sum__w3600000000`,
    min(CASE WHEN `tile_start` >= :as_of_us - 3600000000 THEN `amount__min` END) AS `amount__min__w3600000000`,
    max(CASE WHEN `tile_start` >= :as_of_us - 3600000000 THEN `amount__max` END) AS `amount__max__w3600000000`,
    max(CASE WHEN `amount__last_ts` IS NOT NULL AND (`tile_start` >= :as_of_us - 3600000000) THEN named_struct('t', `amount__last_ts`, 'v', `amount__last`) END).v AS `amount__last__w3600000000`,
    max(CASE WHEN `amount__last_ts` IS NOT NULL AND (`tile_start` >= :as_of_us - 3600000000) THEN named_struct('t', `amount__last_ts`, 'v', `amount__last`) END).t AS `amount__last_ts__w3600000000`,
    sum(CASE WHEN `tile_start` >= :as_of_us - 3600000000 THEN `amount__sumsq` END) AS `amount__sumsq__w3600000000`,
    CAST(sum(CASE WHEN `tile_start` >= :as_of_us - 7200000000 THEN `qty__cnt` END) AS BIGINT) AS `qty__cnt__w7200000000`,
    sum(CASE WHEN `tile_start` >= :as_of_us - 7200000000 THEN `qty__sum` END) AS `qty__sum__w7200000000`
  FROM `tiles`
  WHERE `tile_start` >= :as_of_us - 7200000000 AND `tile_start` < :as_of_us
  GROUP BY `user_id`
)
SELECT
  `user_id`,
  coalesce(`amount__cnt__w3600000000`, 0) AS `amount_count_1h`,
  coalesce(`amount__sum__w3600000000`, 0) AS `amount_sum_1h`,
  CASE WHEN `amount__cnt__w3600000000` > 0 THEN `amount__sum__w3600000000` / `amount__cnt__w3600000000` END AS `amount_mean_1h`,
  `amount__min__w3600000000` AS `amount_min_1h`,
  `amount__max__w3600000000` AS `amount_max_1h`,
  `amount__last__w3600000000` AS `amount_last_1h`,
  CASE WHEN `amount__cnt__w3600000000` >= 2 THEN sqrt(greatest((`amount__sumsq__w3600000000` - `amount__sum__w3600000000` * `amount__sum__w3600000000` / `amount__cnt__w3600000000`) / (`amount__cnt__w3600000000` - 1), 0)) END AS `amount_stddev_1h`,
  coalesce(`qty__sum__w7200000000`, 0) AS `qty_sum_2h`
FROM `merged`
ORDER BY `user_id`
