-- Quiver streaming job (Flink SQL); generated, do not edit.
SET 'table.local-time-zone' = 'UTC';
SET 'table.exec.mini-batch.enabled' = 'false';
SET 'table.exec.state.ttl' = '87002000 ms';
SET 'table.exec.uid.generation' = 'ALWAYS';

CREATE TABLE `src__events` (
  `ts_us` BIGINT,
  `ts_ms` BIGINT,
  `user_id` BIGINT,
  `merchant_id` BIGINT,
  `amount` DOUBLE,
  `cat` STRING,
  `qty` BIGINT,
  `flag` BOOLEAN,
  `__batch` STRING
) WITH (
  'connector' = 'filesystem',
  'path' = 'file:///srv/quiver/stream/inbox/events',
  'format' = 'json',
  'json.fail-on-missing-field' = 'false',
  'json.ignore-parse-errors' = 'false',
  'source.monitor-interval' = '200 ms'
);

CREATE TEMPORARY VIEW `events__events` AS
SELECT
  COALESCE(`ts_us`, `ts_ms` * 1000) AS `__ts_us`,
  `user_id`,
  `merchant_id`,
  `amount`,
  `cat`,
  `qty`,
  `flag`,
  `__batch`
FROM `src__events`;

CREATE TABLE `last__pair_last` (
  `user_id` BIGINT,
  `merchant_id` BIGINT,
  `__batch` STRING,
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
  `__newest_us` BIGINT,
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
  `__newest_us` BIGINT,
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
  INSERT INTO `last__pair_last`
  SELECT
    `user_id`,
    `merchant_id`,
    `__batch`,
    `event_ts`,
    `amount`,
    `cat`
  FROM (
    SELECT
      `user_id`,
      `merchant_id`,
      `__batch`,
      `__ts_us` AS `event_ts`,
      `amount`,
      `cat`,
      ROW_NUMBER() OVER (PARTITION BY `user_id`, `merchant_id`, `__batch` ORDER BY `__ts_us` DESC, `amount` DESC NULLS LAST, `cat` DESC NULLS LAST) AS `__rank`
    FROM `events__events`
  )
  WHERE `__rank` = 1;
  INSERT INTO `tiles__user_activity`
  SELECT
    `user_id`,
    `tile_start`,
    `n_events`,
    `__newest_us`,
    `amount__cnt`,
    `amount__sum`,
    CASE WHEN `amount__min` IS NULL AND `amount__nan` > 0 THEN CAST('NaN' AS DOUBLE) ELSE `amount__min` END AS `amount__min`,
    CASE WHEN `amount__nan` > 0 THEN CAST('NaN' AS DOUBLE) ELSE `amount__max` END AS `amount__max`,
    CAST(SUBSTR(`amount__last__key`, 60) AS DOUBLE) AS `amount__last`,
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
      MAX(`__ts_us`) AS `__newest_us`,
      count(`amount`) AS `amount__cnt`,
      sum(`amount`) AS `amount__sum`,
      COUNT(CASE WHEN ABS(`amount`) >= 0 THEN CAST(NULL AS DOUBLE) ELSE `amount` END) AS `amount__nan`,
      MIN(CASE WHEN ABS(`amount`) >= 0 THEN `amount` END) AS `amount__min`,
      MAX(CASE WHEN ABS(`amount`) >= 0 THEN `amount` END) AS `amount__max`,
      MAX(CASE WHEN `amount` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || CASE WHEN ABS(`amount`) >= 0 THEN (CASE WHEN `amount` >= 1e19 THEN '2000000000000000000000000000000000000000' WHEN `amount` <= -1e19 THEN '0000000000000000000000000000000000000000' ELSE '1' || LPAD(CAST(CAST(CASE WHEN `amount` > -1e19 AND `amount` < 1e19 THEN `amount` ELSE 0 END AS DECIMAL(38, 18)) + CAST('10000000000000000000' AS DECIMAL(20, 0)) AS STRING), 39, '0') END) ELSE '3000000000000000000000000000000000000000' END || CAST(`amount` AS STRING) END) AS `amount__last__key`,
      sum(`amount` * `amount`) AS `amount__sumsq`,
      count(`qty`) AS `qty__cnt`,
      sum(CAST(`qty` AS DOUBLE)) AS `qty__sum`,
      min(`qty`) AS `qty__min`,
      max(`qty`) AS `qty__max`,
      MAX(CASE WHEN `qty` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || LPAD(CAST(CAST(`qty` AS DECIMAL(20, 0)) + CAST('9223372036854775808' AS DECIMAL(20, 0)) AS STRING), 20, '0') END) AS `qty__last__key`,
      sum(CAST(`qty` AS DOUBLE) * CAST(`qty` AS DOUBLE)) AS `qty__sumsq`,
      count(`flag`) AS `flag__cnt`,
      sum(CAST(`flag` AS DOUBLE)) AS `flag__sum`,
      min(CAST(`flag` AS BIGINT)) AS `flag__min`,
      max(CAST(`flag` AS BIGINT)) AS `flag__max`,
      MAX(CASE WHEN CAST(`flag` AS BIGINT) IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || LPAD(CAST(CAST(CAST(`flag` AS BIGINT) AS DECIMAL(20, 0)) + CAST('9223372036854775808' AS DECIMAL(20, 0)) AS STRING), 20, '0') END) AS `flag__last__key`,
      sum(CAST(`flag` AS DOUBLE) * CAST(`flag` AS DOUBLE)) AS `flag__sumsq`,
      count(`cat`) AS `cat__cnt`,
      MAX(CASE WHEN `cat` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || `cat` END) AS `cat__last__key`
    FROM (
      SELECT
        `user_id`,
        `__ts_us` - MOD(MOD(`__ts_us`, 300000000) + 300000000, 300000000) AS `tile_start`,
        `__ts_us`,
        `amount`,
        `qty`,
        `flag`,
        `cat`
      FROM `events__events`
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
      `__ts_us` AS `event_ts`,
      `amount`,
      `qty`,
      `flag`,
      `cat`,
      `merchant_id` AS `last_merchant`,
      ROW_NUMBER() OVER (PARTITION BY `user_id` ORDER BY `__ts_us` DESC, `amount` DESC NULLS LAST, `qty` DESC NULLS LAST, `flag` DESC NULLS LAST, `cat` DESC NULLS LAST, `merchant_id` DESC NULLS LAST) AS `__rank`
    FROM `events__events`
  )
  WHERE `__rank` = 1;
  INSERT INTO `tiles__user_merchant`
  SELECT
    `user_id`,
    `merchant_id`,
    `tile_start`,
    `n_events`,
    `__newest_us`,
    `amount__cnt`,
    `amount__sum`,
    CAST(SUBSTR(`amount__last__key`, 60) AS DOUBLE) AS `amount__last`,
    CAST(SUBSTR(`amount__last__key`, 1, 19) AS BIGINT) AS `amount__last_ts`,
    `qty__cnt`,
    `qty__max`
  FROM (
    SELECT
      `user_id`,
      `merchant_id`,
      `tile_start`,
      COUNT(*) AS `n_events`,
      MAX(`__ts_us`) AS `__newest_us`,
      count(`amount`) AS `amount__cnt`,
      sum(`amount`) AS `amount__sum`,
      MAX(CASE WHEN `amount` IS NOT NULL THEN LPAD(CAST(`__ts_us` AS STRING), 19, '0') || CASE WHEN ABS(`amount`) >= 0 THEN (CASE WHEN `amount` >= 1e19 THEN '2000000000000000000000000000000000000000' WHEN `amount` <= -1e19 THEN '0000000000000000000000000000000000000000' ELSE '1' || LPAD(CAST(CAST(CASE WHEN `amount` > -1e19 AND `amount` < 1e19 THEN `amount` ELSE 0 END AS DECIMAL(38, 18)) + CAST('10000000000000000000' AS DECIMAL(20, 0)) AS STRING), 39, '0') END) ELSE '3000000000000000000000000000000000000000' END || CAST(`amount` AS STRING) END) AS `amount__last__key`,
      count(`qty`) AS `qty__cnt`,
      max(`qty`) AS `qty__max`
    FROM (
      SELECT
        `user_id`,
        `merchant_id`,
        `__ts_us` - MOD(MOD(`__ts_us`, 600000000) + 600000000, 600000000) AS `tile_start`,
        `__ts_us`,
        `amount`,
        `qty`
      FROM `events__events`
    )
    GROUP BY `user_id`, `merchant_id`, `tile_start`
  );
END;
