-- Quiver stats of feature view `user_last`, target spark; generated, do not edit.
-- Parameters :start_us, :end_us: epoch microseconds; events with :start_us <= event time < :end_us.
SELECT
  count(*) FILTER (WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us)) AS `events_in_range`,
  count(*) FILTER (WHERE `ts` >= timestamp_micros(:start_us) AND `ts` < timestamp_micros(:end_us) AND (`user_id` IS NULL)) AS `null_keys`,
  count(*) FILTER (WHERE `ts` IS NULL) AS `null_event_ts`
FROM `events`
