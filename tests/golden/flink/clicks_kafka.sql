-- Quiver streaming job (Flink SQL); generated, do not edit.
SET 'table.local-time-zone' = 'UTC';
SET 'table.exec.mini-batch.enabled' = 'false';
SET 'table.exec.state.ttl' = '90300500 ms';
SET 'table.exec.source.idle-timeout' = '60000 ms';

CREATE TABLE `src__clicks` (
  `line` STRING,
  `__rowtime` AS TO_TIMESTAMP_LTZ(CASE WHEN COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000) <= (UNIX_TIMESTAMP() * 1000 + 0) * 1000 THEN (COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000) - MOD(MOD(COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000), 1000) + 1000, 1000)) / 1000 ELSE 0 END, 3),
  WATERMARK FOR `__rowtime` AS `__rowtime` - INTERVAL '0 00:00:00.500' DAY TO SECOND(3)
) WITH (
  'connector' = 'kafka',
  'topic' = 'clicks',
  'properties.bootstrap.servers' = 'kafka:9092',
  'properties.group.id' = 'quiver-clicks',
  'scan.startup.mode' = 'earliest-offset',
  'format' = 'raw'
);

CREATE TEMPORARY VIEW `clicks__parsed` AS
SELECT
  COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000) AS `__ts_us`,
  `__rowtime`,
  TRY_CAST(JSON_VALUE(`line`, '$.user_id') AS BIGINT) AS `user_id`,
  TRY_CAST(JSON_VALUE(`line`, '$.qty') AS BIGINT) AS `qty`,
  TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE) AS `amount`,
  JSON_VALUE(`line`, '$.cat') AS `cat`,
  `line`,
  CASE
      WHEN NOT (`line` IS JSON OBJECT) THEN 'unparseable_json'
      WHEN JSON_VALUE(`line`, '$.ts_us') IS NULL AND JSON_VALUE(`line`, '$.ts_ms') IS NULL THEN 'null_event_ts'
      WHEN JSON_VALUE(`line`, '$.ts_us') IS NOT NULL AND (TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT) IS NULL OR CAST(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT) AS STRING) <> JSON_VALUE(`line`, '$.ts_us')) THEN 'bad_type:ts_us'
      WHEN JSON_VALUE(`line`, '$.ts_ms') IS NOT NULL AND (TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) IS NULL OR CAST(TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) AS STRING) <> JSON_VALUE(`line`, '$.ts_ms')) THEN 'bad_type:ts_ms'
      WHEN JSON_VALUE(`line`, '$.user_id') IS NOT NULL AND (TRY_CAST(JSON_VALUE(`line`, '$.user_id') AS BIGINT) IS NULL OR CAST(TRY_CAST(JSON_VALUE(`line`, '$.user_id') AS BIGINT) AS STRING) <> JSON_VALUE(`line`, '$.user_id')) THEN 'bad_type:user_id'
      WHEN JSON_VALUE(`line`, '$.qty') IS NOT NULL AND (TRY_CAST(JSON_VALUE(`line`, '$.qty') AS BIGINT) IS NULL OR CAST(TRY_CAST(JSON_VALUE(`line`, '$.qty') AS BIGINT) AS STRING) <> JSON_VALUE(`line`, '$.qty')) THEN 'bad_type:qty'
      WHEN JSON_VALUE(`line`, '$.amount') IS NOT NULL AND TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE) IS NULL THEN 'bad_type:amount'
      WHEN (TRY_CAST(JSON_VALUE(`line`, '$.qty') AS BIGINT)) < CAST(1 AS BIGINT) THEN 'min:qty'
      WHEN (TRY_CAST(JSON_VALUE(`line`, '$.qty') AS BIGINT)) > CAST(5 AS BIGINT) THEN 'max:qty'
      WHEN ((TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE)) IS NOT NULL AND CASE WHEN ABS((TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE))) >= 0 THEN 0 ELSE 1 END = 1) OR abs((TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE))) = CAST('Infinity' AS DOUBLE) THEN 'finite:amount'
      WHEN (TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE)) < CAST('0.0' AS DOUBLE) OR ((TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE)) IS NOT NULL AND CASE WHEN ABS((TRY_CAST(JSON_VALUE(`line`, '$.amount') AS DOUBLE))) >= 0 THEN 0 ELSE 1 END = 1) THEN 'min:amount'
      WHEN (JSON_VALUE(`line`, '$.cat')) NOT IN ('a', 'b') THEN 'one_of:cat'
      WHEN (COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000)) < CAST(1793491200000000 AS BIGINT) THEN 'min:ts'
      WHEN NOT (COALESCE(TRY_CAST(JSON_VALUE(`line`, '$.ts_us') AS BIGINT), TRY_CAST(JSON_VALUE(`line`, '$.ts_ms') AS BIGINT) * 1000) <= (UNIX_TIMESTAMP() * 1000 + 0) * 1000) THEN 'event_ts_in_future'
    END AS `__problem`
FROM `src__clicks`;

CREATE TEMPORARY VIEW `clicks__events` AS
SELECT *
FROM `clicks__parsed`
WHERE `__problem` IS NULL
  AND NOT (CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3));

CREATE TABLE `late__clicks` (
  `ts_us` BIGINT,
  `user_id` BIGINT,
  `qty` BIGINT,
  `amount` DOUBLE,
  `cat` STRING
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
  `line` STRING
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
  `__newest_us` BIGINT,
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
    `__ts_us` AS `ts_us`,
    `user_id`,
    `qty`,
    `amount`,
    `cat`
  FROM `clicks__parsed`
  WHERE `__problem` IS NULL
    AND CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3);
  INSERT INTO `quarantine__clicks`
  SELECT
    `__problem` AS `reason`,
    '' AS `view`,
    `line`
  FROM `clicks__parsed`
  WHERE `__problem` IS NOT NULL
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'user_clicks' AS `view`,
    `line`
  FROM `clicks__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL);
  INSERT INTO `tiles__user_clicks`
  SELECT
    `user_id`,
    `tile_start`,
    `n_events`,
    `__newest_us`,
    `qty__cnt`,
    `qty__sum`
  FROM (
    SELECT
      `user_id`,
      `tile_start`,
      COUNT(*) AS `n_events`,
      MAX(`__ts_us`) AS `__newest_us`,
      count(`qty`) AS `qty__cnt`,
      sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`
    FROM (
      SELECT
        `user_id`,
        `__ts_us` - MOD(MOD(`__ts_us`, 300000000) + 300000000, 300000000) AS `tile_start`,
        `__ts_us`,
        `qty`
      FROM `clicks__events`
    )
    GROUP BY `user_id`, `tile_start`
  );
END;
