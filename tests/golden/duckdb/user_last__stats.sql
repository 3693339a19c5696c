-- Quiver stats of feature view "user_last", target duckdb; generated, do not edit.
-- Parameters $start_us, $end_us: epoch microseconds; events with $start_us <= event time < $end_us.
SELECT
  count(*) FILTER (WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us)) AS "events_in_range",
  count(*) FILTER (WHERE "ts" >= make_timestamptz($start_us) AND "ts" < make_timestamptz($end_us) AND ("user_id" IS NULL)) AS "null_keys",
  count(*) FILTER (WHERE "ts" IS NULL) AS "null_event_ts"
FROM "events"
