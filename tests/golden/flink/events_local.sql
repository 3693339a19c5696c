-- Quiver streaming job (Flink SQL); generated, do not edit.
SET 'table.local-time-zone' = 'UTC';
SET 'table.exec.mini-batch.enabled' = 'false';
SET 'table.exec.state.ttl' = '87002000 ms';

CREATE TABLE `src__events` (
  `ts_ms` STRING,
  `user_id` STRING,
  `merchant_id` STRING,
  `amount` STRING,
  `cat` STRING,
  `qty` STRING,
  `flag` STRING,
  `__ts_ms` AS TRY_CAST(`ts_ms` AS BIGINT),
  `__rowtime` AS TO_TIMESTAMP_LTZ(CASE WHEN TRY_CAST(`ts_ms` AS BIGINT) >= 0 AND TRY_CAST(`ts_ms` AS BIGINT) <= UNIX_TIMESTAMP() * 1000 + 60000 THEN TRY_CAST(`ts_ms` AS BIGINT) ELSE 0 END, 3),
  WATERMARK FOR `__rowtime` AS `__rowtime` - INTERVAL '0 00:00:02.000' DAY TO SECOND(3)
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/inbox/events',
  'format' = 'json',
  'json.fail-on-missing-field' = 'false',
  'json.ignore-parse-errors' = 'true',
  'source.monitor-interval' = '200 ms'
);

CREATE TEMPORARY VIEW `events__parsed` AS
SELECT
  `__ts_ms`,
  `__rowtime`,
  TRY_CAST(`user_id` AS BIGINT) AS `user_id`,
  TRY_CAST(`merchant_id` AS BIGINT) AS `merchant_id`,
  TRY_CAST(`amount` AS DOUBLE) AS `amount`,
  `cat`,
  TRY_CAST(`qty` AS BIGINT) AS `qty`,
  TRY_CAST(`flag` AS BOOLEAN) AS `flag`,
  `ts_ms` AS `__raw_ts_ms`,
  `user_id` AS `__raw_user_id`,
  `merchant_id` AS `__raw_merchant_id`,
  `amount` AS `__raw_amount`,
  `cat` AS `__raw_cat`,
  `qty` AS `__raw_qty`,
  `flag` AS `__raw_flag`,
  CASE
      WHEN `ts_ms` IS NULL THEN 'null_event_ts'
      WHEN `__ts_ms` IS NULL OR CAST(`__ts_ms` AS STRING) <> `ts_ms` THEN 'bad_type:ts_ms'
      WHEN NOT (`__ts_ms` >= 0 AND `__ts_ms` <= UNIX_TIMESTAMP() * 1000 + 60000) THEN 'event_ts_out_of_range'
      WHEN `user_id` IS NOT NULL AND (TRY_CAST(`user_id` AS BIGINT) IS NULL OR CAST(TRY_CAST(`user_id` AS BIGINT) AS STRING) <> `user_id`) THEN 'bad_type:user_id'
      WHEN `merchant_id` IS NOT NULL AND (TRY_CAST(`merchant_id` AS BIGINT) IS NULL OR CAST(TRY_CAST(`merchant_id` AS BIGINT) AS STRING) <> `merchant_id`) THEN 'bad_type:merchant_id'
      WHEN `amount` IS NOT NULL AND TRY_CAST(`amount` AS DOUBLE) IS NULL THEN 'bad_type:amount'
      WHEN `qty` IS NOT NULL AND (TRY_CAST(`qty` AS BIGINT) IS NULL OR CAST(TRY_CAST(`qty` AS BIGINT) AS STRING) <> `qty`) THEN 'bad_type:qty'
      WHEN `flag` IS NOT NULL AND TRY_CAST(`flag` AS BOOLEAN) IS NULL THEN 'bad_type:flag'
    END AS `__problem`
FROM `src__events`;

CREATE TEMPORARY VIEW `events__on_time` AS
SELECT *
FROM `events__parsed`
WHERE `__problem` IS NULL
  AND NOT (CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 00:10:00.000' DAY TO SECOND(3));

CREATE TABLE `late__events` (
  `ts_ms` BIGINT,
  `user_id` BIGINT,
  `merchant_id` BIGINT,
  `amount` DOUBLE,
  `cat` STRING,
  `qty` BIGINT,
  `flag` BOOLEAN
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/late/events',
  'format' = 'json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `quarantine__events` (
  `reason` STRING,
  `view` STRING,
  `ts_ms` STRING,
  `user_id` STRING,
  `merchant_id` STRING,
  `amount` STRING,
  `cat` STRING,
  `qty` STRING,
  `flag` STRING
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/quarantine/events',
  'format' = 'json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `last__pair_last` (
  `user_id` BIGINT,
  `merchant_id` BIGINT,
  `event_ts` BIGINT,
  `amount` DOUBLE,
  `cat` STRING
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/last/pair_last',
  'format' = 'debezium-json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `tiles__user_activity` (
  `user_id` BIGINT,
  `tile_start` BIGINT,
  `n_events` BIGINT,
  `amount__cnt` BIGINT,
  `amount__sum` DOUBLE,
  `amount__min` DOUBLE,
  `amount__max` DOUBLE,
  `amount__last` DOUBLE,
  `amount__last_ts` BIGINT,
  `amount__sumsq` DOUBLE,
  `qty__cnt` BIGINT,
  `qty__sum` DOUBLE,
  `qty__min` BIGINT,
  `qty__max` BIGINT,
  `qty__last` BIGINT,
  `qty__last_ts` BIGINT,
  `qty__sumsq` DOUBLE,
  `flag__cnt` BIGINT,
  `flag__sum` DOUBLE,
  `flag__min` BIGINT,
  `flag__max` BIGINT,
  `flag__last` BIGINT,
  `flag__last_ts` BIGINT,
  `flag__sumsq` DOUBLE,
  `cat__cnt` BIGINT,
  `cat__last` STRING,
  `cat__last_ts` BIGINT
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/tiles/user_activity',
  'format' = 'debezium-json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `last__user_last` (
  `user_id` BIGINT,
  `event_ts` BIGINT,
  `amount` DOUBLE,
  `qty` BIGINT,
  `flag` BOOLEAN,
  `cat` STRING,
  `last_merchant` BIGINT
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/last/user_last',
  'format' = 'debezium-json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

CREATE TABLE `tiles__user_merchant` (
  `user_id` BIGINT,
  `merchant_id` BIGINT,
  `tile_start` BIGINT,
  `n_events` BIGINT,
  `amount__cnt` BIGINT,
  `amount__sum` DOUBLE,
  `amount__last` DOUBLE,
  `amount__last_ts` BIGINT,
  `qty__cnt` BIGINT,
  `qty__max` BIGINT
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/sinks/tiles/user_merchant',
  'format' = 'debezium-json',
  'sink.rolling-policy.rollover-interval' = '500 ms',
  'sink.rolling-policy.inactivity-interval' = '500 ms',
  'sink.rolling-policy.check-interval' = '125 ms'
);

EXECUTE STATEMENT SET BEGIN
  INSERT INTO `late__events`
  SELECT
    `__ts_ms` AS `ts_ms`,
    `user_id`,
    `merchant_id`,
    `amount`,
    `cat`,
    `qty`,
    `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NULL
    AND CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 00:10:00.000' DAY TO SECOND(3);
  INSERT INTO `quarantine__events`
  SELECT
    `__problem` AS `reason`,
    '' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_merchant_id` AS `merchant_id`,
    `__raw_amount` AS `amount`,
    `__raw_cat` AS `cat`,
    `__raw_qty` AS `qty`,
    `__raw_flag` AS `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NOT NULL
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'pair_last' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_merchant_id` AS `merchant_id`,
    `__raw_amount` AS `amount`,
    `__raw_cat` AS `cat`,
    `__raw_qty` AS `qty`,
    `__raw_flag` AS `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL OR `merchant_id` IS NULL)
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'user_activity' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_merchant_id` AS `merchant_id`,
    `__raw_amount` AS `amount`,
    `__raw_cat` AS `cat`,
    `__raw_qty` AS `qty`,
    `__raw_flag` AS `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL)
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'user_last' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_merchant_id` AS `merchant_id`,
    `__raw_amount` AS `amount`,
    `__raw_cat` AS `cat`,
    `__raw_qty` AS `qty`,
    `__raw_flag` AS `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL)
  UNION ALL
  SELECT
    'null_key' AS `reason`,
    'user_merchant' AS `view`,
    `__raw_ts_ms` AS `ts_ms`,
    `__raw_user_id` AS `user_id`,
    `__raw_merchant_id` AS `merchant_id`,
    `__raw_amount` AS `amount`,
    `__raw_cat` AS `cat`,
    `__raw_qty` AS `qty`,
    `__raw_flag` AS `flag`
  FROM `events__parsed`
  WHERE `__problem` IS NULL
    AND (`user_id` IS NULL OR `merchant_id` IS NULL);
  INSERT INTO `last__pair_last`
  SELECT
    `user_id`,
    `merchant_id`,
    `event_ts`,
    `amount`,
    `cat`
  FROM (
    SELECT
      `user_id`,
      `merchant_id`,
      `__ts_ms` * 1000 AS `event_ts`,
      `amount`,
      `cat`,
      ROW_NUMBER() OVER (PARTITION BY `user_id`, `merchant_id` ORDER BY `__ts_ms` DESC, `amount` DESC NULLS LAST, `cat` DESC NULLS LAST) AS `__rank`
    FROM `events__on_time`
    WHERE `user_id` IS NOT NULL AND `merchant_id` IS NOT NULL
  )
  WHERE `__rank` = 1;
  INSERT INTO `tiles__user_activity`
  SELECT
    `user_id`,
    `tile_start`,
    `n_events`,
    `amount__cnt`,
    `amount__sum`,
    `amount__min`,
    `amount__max`,
    CAST(SUBSTR(`amount__last__key`, 59) AS DOUBLE) AS `amount__last`,
    CAST(SUBSTR(`amount__last__key`, 1, 19) AS BIGINT) AS `amount__last_ts`,
    `amount__sumsq`,
    `qty__cnt`,
    `qty__sum`,
    `qty__min`,
    `qty__max`,
    CAST(CAST(SUBSTR(`qty__last__key`, 20) AS DECIMAL(20, 0)) - CAST('9223372036854775808' AS DECIMAL(20, 0)) AS BIGINT) AS `qty__last`,
    CAST(SUBSTR(`qty__last__key`, 1, 19) AS BIGINT) AS `qty__last_ts`,
    `qty__sumsq`,
    `flag__cnt`,
    `flag__sum`,
    `flag__min`,
    `flag__max`,
    CAST(CAST(SUBSTR(`flag__last__key`, 20) AS DECIMAL(20, 0)) - CAST('9223372036854775808' AS DECIMAL(20, 0)) AS BIGINT) AS `flag__last`,
    CAST(SUBSTR(`flag__last__key`, 1, 19) AS BIGINT) AS `flag__last_ts`,
    `flag__sumsq`,
    `cat__cnt`,
    SUBSTR(`cat__last__key`, 20) AS `cat__last`,
    CAST(SUBSTR(`cat__last__key`, 1, 19) AS BIGINT) AS `cat__last_ts`
  FROM (
    SELECT
      `user_id`,
      `tile_start`,
      COUNT(*) AS `n_events`,
      count(`amount`) AS `amount__cnt`,
      sum(`amount`) AS `amount__sum`,
      min(`amount`) AS `amount__min`,
      max(`amount`) AS `amount__max`,
      max(CASE WHEN `amount` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || CASE WHEN `amount` >= 1e19 THEN '999999999999999999999999999999999999999' WHEN `amount` <= -1e19 THEN '000000000000000000000000000000000000000' ELSE LPAD(CAST(CAST(`amount` AS DECIMAL(38, 18)) + CAST('10000000000000000000' AS DECIMAL(20, 0)) AS STRING), 39, '0') END || CAST(`amount` AS STRING) END) AS `amount__last__key`,
      sum(`amount` * `amount`) AS `amount__sumsq`,
      count(`qty`) AS `qty__cnt`,
      sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`,
      min(`qty`) AS `qty__min`,
      max(`qty`) AS `qty__max`,
      max(CASE WHEN `qty` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || LPAD(CAST(CAST(`qty` AS DECIMAL(20, 0)) + CAST('9223372036854775808' AS DECIMAL(20, 0)) AS STRING), 20, '0') END) AS `qty__last__key`,
      sum(CAST(`qty` AS DOUBLE) * CAST(`qty` AS DOUBLE)) AS `qty__sumsq`,
      count(`flag`) AS `flag__cnt`,
      sum(CAST(`flag` AS DOUBLE)) AS `flag__sum`,
      min(CAST(`flag` AS BIGINT)) AS `flag__min`,
      max(CAST(`flag` AS BIGINT)) AS `flag__max`,
      max(CASE WHEN CAST(`flag` AS BIGINT) IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || LPAD(CAST(CAST(CAST(`flag` AS BIGINT) AS DECIMAL(20, 0)) + CAST('9223372036854775808' AS DECIMAL(20, 0)) AS STRING), 20, '0') END) AS `flag__last__key`,
      sum(CAST(`flag` AS DOUBLE) * CAST(`flag` AS DOUBLE)) AS `flag__sumsq`,
      count(`cat`) AS `cat__cnt`,
      max(CASE WHEN `cat` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || `cat` END) AS `cat__last__key`
    FROM (
      SELECT
        `user_id`,
        (`__ts_ms` - MOD(`__ts_ms`, 300000)) * 1000 AS `tile_start`,
        `__ts_ms` * 1000 AS `__ts_us`,
        `amount`,
        `qty`,
        `flag`,
        `cat`
      FROM `events__on_time`
      WHERE `user_id` IS NOT NULL
    )
    GROUP BY `user_id`, `tile_start`
  );
  INSERT INTO `last__user_last`
  SELECT
    `user_id`,
    `event_ts`,
    `amount`,
    `qty`,
    `flag`,
    `cat`,
    `last_merchant`
  FROM (
    SELECT
      `user_id`,
      `__ts_ms` * 1000 AS `event_ts`,
      `amount`,
      `qty`,
      `flag`,
      `cat`,
      `merchant_id` AS `last_merchant`,
      ROW_NUMBER() OVER (PARTITION BY `user_id` ORDER BY `__ts_ms` DESC, `amount` DESC NULLS LAST, `qty` DESC NULLS LAST, `flag` DESC NULLS LAST, `cat` DESC NULLS LAST, `merchant_id` DESC NULLS LAST) AS `__rank`
    FROM `events__on_time`
    WHERE `user_id` IS NOT NULL
  )
  WHERE `__rank` = 1;
  INSERT INTO `tiles__user_merchant`
  SELECT
    `user_id`,
    `merchant_id`,
    `tile_start`,
    `n_events`,
    `amount__cnt`,
    `amount__sum`,
    CAST(SUBSTR(`amount__last__key`, 59) AS DOUBLE) AS `amount__last`,
    CAST(SUBSTR(`amount__last__key`, 1, 19) AS BIGINT) AS `amount__last_ts`,
    `qty__cnt`,
    `qty__max`
  FROM (
    SELECT
      `user_id`,
      `merchant_id`,
      `tile_start`,
      COUNT(*) AS `n_events`,
      count(`amount`) AS `amount__cnt`,
      sum(`amount`) AS `amount__sum`,
      max(CASE WHEN `amount` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || CASE WHEN `amount` >= 1e19 THEN '999999999999999999999999999999999999999' WHEN `amount` <= -1e19 THEN '000000000000000000000000000000000000000' ELSE LPAD(CAST(CAST(`amount` AS DECIMAL(38, 18)) + CAST('10000000000000000000' AS DECIMAL(20, 0)) AS STRING), 39, '0') END || CAST(`amount` AS STRING) END) AS `amount__last__key`,
      count(`qty`) AS `qty__cnt`,
      max(`qty`) AS `qty__max`
    FROM (
      SELECT
        `user_id`,
        `merchant_id`,
        (`__ts_ms` - MOD(`__ts_ms`, 600000)) * 1000 AS `tile_start`,
        `__ts_ms` * 1000 AS `__ts_us`,
        `amount`,
        `qty`
      FROM `events__on_time`
      WHERE `user_id` IS NOT NULL AND `merchant_id` IS NOT NULL
    )
    GROUP BY `user_id`, `merchant_id`, `tile_start`
  );
END;
