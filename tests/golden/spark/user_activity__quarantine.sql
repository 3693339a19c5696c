-- Quiver quarantine of feature view `user_activity`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
SELECT
  CAST(`user_id` AS BIGINT) AS `user_id`,
  CAST(`ts` AS TIMESTAMP) AS `ts`,
  CAST(`amount` AS DOUBLE) AS `amount`,
  CAST(`qty` AS BIGINT) AS `qty`,
  CAST(`flag` AS BOOLEAN) AS `flag`,
  CAST(`cat` AS STRING) AS `cat`,
  CASE WHEN `ts` IS NULL THEN 'null_event_ts' ELSE 'null_key' END AS `quarantine_reason`,
  to_date(timestamp_micros(unix_micros(CAST(`ts` AS TIMESTAMP)))) AS `__date`
FROM `events`
WHERE `ts` IS NULL
   OR (`ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us) AND (`user_id` IS NULL))
