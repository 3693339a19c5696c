-- Quiver streaming job (Flink SQL); generated, do not edit.
SET 'table.local-time-zone' = 'UTC';
SET 'table.exec.mini-batch.enabled' = 'false';
SET 'table.exec.state.ttl' = '90300500 ms';

CREATE TABLE `src__clicks` (
  `ts_ms` STRING,
  `user_id` STRING,
  `qty` STRING,
  `__ts_ms` AS TRY_CAST(`ts_ms` AS BIGINT),
  `__rowtime` AS TO_TIMESTAMP_LTZ(CASE WHEN TRY_CAST(`ts_ms` AS BIGINT) >= 0 AND TRY_CAST(`ts_ms` AS BIGINT) <= UNIX_TIMESTAMP() * 1000 + 60000 THEN TRY_CAST(`ts_ms` AS BIGINT) ELSE 0 END, 3),
  WATERMARK FOR `__rowtime` AS `__rowtime` - INTERVAL '0 00:00:00.500' DAY TO SECOND(3)
) WITH (
  'connector' = 'kafka',
  'topic' = 'clicks',
  'properties.bootstrap.servers' = 'kafka:9092',
  'properties.group.id' = 'quiver-clicks',
  'scan.startup.mode' = 'group-offsets',
  'properties.auto.offset.reset' = 'earliest',
  'format' = 'json',
  'json.fail-on-missing-field' = 'false',
  'json.ignore-parse-errors' = 'true'
);

CREATE TEMPORARY VIEW `clicks__parsed` AS
SELECT
  `__ts_ms`,
  `__rowtime`,
  TRY_CAST(`user_id` AS BIGINT) AS `user_id`,
  TRY_CAST(`qty` AS BIGINT) AS `qty`,
  `ts_ms` AS `__raw_ts_ms`,
  `user_id` AS `__raw_user_id`,
  `qty` AS `__raw_qty`,
  CASE
      WHEN `ts_ms` IS NULL THEN 'null_event_ts'
      WHEN `__ts_ms` IS NULL OR CAST(`__ts_ms` AS STRING) <> `ts_ms` THEN 'bad_type:ts_ms'
      WHEN NOT (`__ts_ms` >= 0 AND `__ts_ms` <= UNIX_TIMESTAMP() * 1000 + 60000) THEN 'event_ts_out_of_range'
      WHEN `user_id` IS NOT NULL AND (TRY_CAST(`user_id` AS BIGINT) IS NULL OR CAST(TRY_CAST(`user_id` AS BIGINT) AS STRING) <> `user_id`) THEN 'bad_type:user_id'
      WHEN `qty` IS NOT NULL AND (TRY_CAST(`qty` AS BIGINT) IS NULL OR CAST(TRY_CAST(`qty` AS BIGINT) AS STRING) <> `qty`) THEN 'bad_type:qty'
    END AS `__problem`
FROM `src__clicks`;

CREATE TEMPORARY VIEW `clicks__on_time` AS
SELECT *
FROM `clicks__parsed`
WHERE `__problem` IS NULL
  AND NOT (CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3));

CREATE TABLE `late__clicks` (
  `ts_ms` BIGINT,
  `user_id` BIGINT,
  `qty` BIGINT
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/late/clicks',
  'format' = 'json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `quarantine__clicks` (
  `reason` STRING,
  `view` STRING,
  `ts_ms` STRING,
  `user_id` STRING,
  `qty` STRING
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/quarantine/clicks',
  'format' = 'json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `tiles__user_clicks` (
  `user_id` BIGINT,
  `tile_start` BIGINT,
  `n_events` BIGINT,
  `qty__cnt` BIGINT,
  `qty__sum` DOUBLE
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/tiles/user_clicks',
  'format' = 'debezium-json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

EXECUTE STATEMENT SET BEGIN
  INSERT INTO `late__clicks`
  SELECT
    `__ts_ms` AS `ts_ms`,
    `user_id`,
    `qty`
  FROM `clicks__parsed`
  WHERE `__problem` IS NULL
    AND CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3);
  INSERT INTO `quarantine__clicks`
  SELECT
    `__problem` AS `reason`,
    '' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_qty` AS `qty`
  FROM `clicks__parsed`
  WHERE `__problem` IS NOT NULL
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'user_clicks' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_qty` AS `qty`
  FROM `clicks__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL);
  INSERT INTO `tiles__user_clicks`
  SELECT
    `user_id`,
    `tile_start`,
    `n_events`,
    `qty__cnt`,
    `qty__sum`
  FROM (
    SELECT
      `user_id`,
      `tile_start`,
      COUNT(*) AS `n_events`,
      count(`qty`) AS `qty__cnt`,
      sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`
    FROM (
      SELECT
        `user_id`,
        (`__ts_ms` - MOD(`__ts_ms`, 300000)) * 1000 AS `tile_start`,
        `__ts_ms` * 1000 AS `__ts_us`,
        `qty`
      FROM `clicks__on_time`
      WHERE `user_id` IS NOT NULL
    )
    GROUP BY `user_id`, `tile_start`
  );
END;
