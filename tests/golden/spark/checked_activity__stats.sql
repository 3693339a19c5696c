-- Quiver stats of feature view `checked_activity`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
WITH `rows` AS (
  SELECT
    `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us) AS `__in_range`,
    `ts` IS NULL AS `__null_ts`,
    (`user_id` IS NULL) AS `__null_key`,
    CASE WHEN `ts` IS NOT NULL THEN CASE WHEN `user_id` IS NULL THEN 'not_null:user_id' WHEN isnan(`amount`) OR abs(`amount`) = CAST('Infinity' AS DOUBLE) THEN 'finite:amount' WHEN `amount` < CAST('1.0' AS DOUBLE) OR isnan(`amount`) THEN 'min:amount' WHEN `amount` > CAST('150.0' AS DOUBLE) OR isnan(`amount`) THEN 'max:amount' WHEN `qty` < CAST(-3 AS BIGINT) THEN 'min:qty' WHEN `qty` > CAST(5 AS BIGINT) THEN 'max:qty' WHEN `cat` NOT IN ('a', 'b', 'c') THEN 'one_of:cat' WHEN unix_micros(CAST(`ts` AS TIMESTAMP)) < CAST(1709186400000000 AS BIGINT) THEN 'min:ts' WHEN unix_micros(CAST(`ts` AS TIMESTAMP)) > :now_us + CAST(3600000000 AS BIGINT) THEN 'future:ts' END END AS `__reason`
  FROM `checked_events`
)
SELECT
  count(*) FILTER (WHERE `__in_range`) AS `events_in_range`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` IS NULL AND `__null_key`) AS `null_keys`,
  count(*) FILTER (WHERE `__null_ts`) AS `null_event_ts`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'not_null:user_id') AS `not_null:user_id`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'finite:amount') AS `finite:amount`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'min:amount') AS `min:amount`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'max:amount') AS `max:amount`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'min:qty') AS `min:qty`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'max:qty') AS `max:qty`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'one_of:cat') AS `one_of:cat`,
  count(*) FILTER (WHERE `__in_range` AND `__reason` = 'min:ts') AS `min:ts`,
  count(*) FILTER (WHERE `__reason` = 'future:ts') AS `future:ts`
FROM `rows`
