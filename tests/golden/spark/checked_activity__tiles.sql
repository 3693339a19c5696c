-- Quiver tiles of feature view `checked_activity`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
WITH `events` AS (
  SELECT
    CAST(`user_id` AS BIGINT) AS `user_id`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) AS `__ts_us`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) - ((unix_micros(CAST(`ts` AS TIMESTAMP)) % 300000000) + 300000000) % 300000000 AS `tile_start`,
    CAST(`amount` AS DOUBLE) AS `amount`,
    CAST(`qty` AS BIGINT) AS `qty`
  FROM `checked_events`
  WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us)
    AND `user_id` IS NOT NULL
    AND CASE WHEN `user_id` IS NULL THEN 'not_null:user_id' WHEN isnan(`amount`) OR abs(`amount`) = CAST('Infinity' AS DOUBLE) THEN 'finite:amount' WHEN `amount` < CAST('1.0' AS DOUBLE) OR isnan(`amount`) THEN 'min:amount' WHEN `amount` > CAST('150.0' AS DOUBLE) OR isnan(`amount`) THEN 'max:amount' WHEN `qty` < CAST(-3 AS BIGINT) THEN 'min:qty' WHEN `qty` > CAST(5 AS BIGINT) THEN 'max:qty' WHEN `cat` NOT IN ('a', 'b', 'c') THEN 'one_of:cat' WHEN unix_micros(CAST(`ts` AS TIMESTAMP)) < CAST(1709186400000000 AS BIGINT) THEN 'min:ts' WHEN unix_micros(CAST(`ts` AS TIMESTAMP)) > :now_us + CAST(3600000000 AS BIGINT) THEN 'future:ts' END IS NULL
), `tiles` AS (
  SELECT
    `user_id`,
    `tile_start`,
    count(*) AS `n_events`,
    count(`amount`) AS `amount__cnt`,
    sum(`amount`) AS `amount__sum`,
    min(`amount`) AS `amount__min`,
    max(`amount`) AS `amount__max`,
    max(CASE WHEN `amount` IS NOT NULL THEN named_struct('t', `__ts_us`, 'v', `amount`) END) AS `amount__last`,
    sum(`amount` * `amount`) AS `amount__sumsq`,
    count(`qty`) AS `qty__cnt`,
    sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`
  FROM `events`
  GROUP BY `user_id`, `tile_start`
)
SELECT
  `user_id`,
  `tile_start`,
  `n_events`,
  `amount__cnt`,
  `amount__sum`,
  `amount__min`,
  `amount__max`,
  `amount__last`.v AS `amount__last`,
  `amount__last`.t AS `amount__last_ts`,
  `amount__sumsq`,
  `qty__cnt`,
  `qty__sum`,
  to_date(timestamp_micros(`tile_start`)) AS `__date`
FROM `tiles`
DISTRIBUTE BY `__date` SORT BY `__date`, `user_id`, `tile_start`
