-- Quiver tiles of feature view `user_merchant`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
WITH `events` AS (
  SELECT
    CAST(`user_id` AS BIGINT) AS `user_id`,
    CAST(`merchant_id` AS BIGINT) AS `merchant_id`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) AS `__ts_us`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) - ((unix_micros(CAST(`ts` AS TIMESTAMP)) % 600000000) + 600000000) % 600000000 AS `tile_start`,
    CAST(`amount` AS DOUBLE) AS `amount`,
    CAST(`qty` AS BIGINT) AS `qty`
  FROM `events`
  WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us)
    AND `user_id` IS NOT NULL AND `merchant_id` IS NOT NULL
), `tiles` AS (
  SELECT
    `user_id`,
    `merchant_id`,
    `tile_start`,
    count(*) AS `n_events`,
    count(`amount`) AS `amount__cnt`,
    sum(`amount`) AS `amount__sum`,
    max(CASE WHEN `amount` IS NOT NULL THEN named_struct('t', `__ts_us`, 'v', `amount`) END) AS `amount__last`,
    count(`qty`) AS `qty__cnt`,
    max(`qty`) AS `qty__max`
  FROM `events`
  GROUP BY `user_id`, `merchant_id`, `tile_start`
)
SELECT
  `user_id`,
  `merchant_id`,
  `tile_start`,
  `n_events`,
  `amount__cnt`,
  `amount__sum`,
  `amount__last`.v AS `amount__last`,
  `amount__last`.t AS `amount__last_ts`,
  `qty__cnt`,
  `qty__max`,
  to_date(timestamp_micros(`tile_start`)) AS `__date`
FROM `tiles`
DISTRIBUTE BY `__date` SORT BY `__date`, `user_id`, `merchant_id`, `tile_start`
