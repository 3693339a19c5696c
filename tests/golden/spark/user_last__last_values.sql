-- Quiver last_values of feature view `user_last`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
WITH `events` AS (
  SELECT
    CAST(`user_id` AS BIGINT) AS `user_id`,
    unix_micros(CAST(`ts` AS TIMESTAMP)) AS `__ts_us`,
    CAST(`amount` AS DOUBLE) AS `amount`,
    CAST(`qty` AS BIGINT) AS `qty`,
    CAST(`flag` AS BOOLEAN) AS `flag`,
    CAST(`cat` AS STRING) AS `cat`,
    CAST(`merchant_id` AS BIGINT) AS `last_merchant`
  FROM `events`
  WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us)
    AND `user_id` IS NOT NULL
), `ranked` AS (
  SELECT *, row_number() OVER (PARTITION BY `user_id`, `__ts_us` ORDER BY `amount` DESC NULLS LAST, `qty` DESC NULLS LAST, `flag` DESC NULLS LAST, `cat` DESC NULLS LAST, `last_merchant` DESC NULLS LAST) AS `__rank`
  FROM `events`
)
SELECT
  `user_id`,
  timestamp_micros(`__ts_us`) AS `event_ts`,
  `amount`,
  `qty`,
  `flag`,
  `cat`,
  `last_merchant`,
  to_date(timestamp_micros(`__ts_us`)) AS `__date`
FROM `ranked`
WHERE `__rank` = 1
DISTRIBUTE BY `__date` SORT BY `__date`, `user_id`, `event_ts`
