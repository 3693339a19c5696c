-- Quiver tiles of feature view `user_activity`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
WITH `events` AS (
  SELECT
    CAST(`user_id` AS BIGINT) AS `user_id`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) AS `__ts_us`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) - ((unix_micros(CAST(`ts` AS TIMESTAMP)) % 300000000) + 300000000) % 300000000 AS `tile_start`,
    CAST(`amount` AS DOUBLE) AS `amount`,
    CAST(`qty` AS BIGINT) AS `qty`,
    CAST(`flag` AS BOOLEAN) AS `flag`,
    CAST(`cat` AS STRING) AS `cat`
  FROM `events`
  WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us)
    AND `user_id` IS NOT NULL
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
    sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`,
    min(`qty`) AS `qty__min`,
    max(`qty`) AS `qty__max`,
    max(CASE WHEN `qty` IS NOT NULL THEN named_struct('t', `__ts_us`, 'v', `qty`) END) AS `qty__last`,
    sum(CAST(`qty` AS DOUBLE) * CAST(`qty` AS DOUBLE)) AS `qty__sumsq`,
    count(`flag`) AS `flag__cnt`,
    sum(CAST(`flag` AS DOUBLE)) AS `flag__sum`,
    min(CAST(`flag` AS BIGINT)) AS `flag__min`,
    max(CAST(`flag` AS BIGINT)) AS `flag__max`,
    max(CASE WHEN CAST(`flag` AS BIGINT) IS NOT NULL THEN named_struct('t', `__ts_us`, 'v', CAST(`flag` AS BIGINT)) END) AS `flag__last`,
    sum(CAST(`flag` AS DOUBLE) * CAST(`flag` AS DOUBLE)) AS `flag__sumsq`,
    count(`cat`) AS `cat__cnt`,
    max(CASE WHEN `cat` IS NOT NULL THEN named_struct('t', `__ts_us`, 'v', `cat`) END) AS `cat__last`
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
  `qty__min`,
  `qty__max`,
  `qty__last`.v AS `qty__last`,
  `qty__last`.t AS `qty__last_ts`,
  `qty__sumsq`,
  `flag__cnt`,
  `flag__sum`,
  `flag__min`,
  `flag__max`,
  `flag__last`.v AS `flag__last`,
  `flag__last`.t AS `flag__last_ts`,
  `flag__sumsq`,
  `cat__cnt`,
  `cat__last`.v AS `cat__last`,
  `cat__last`.t AS `cat__last_ts`,
  to_date(timestamp_micros(`tile_start`)) AS `__date`
FROM `tiles`
DISTRIBUTE BY `__date` SORT BY `__date`, `user_id`, `tile_start`
