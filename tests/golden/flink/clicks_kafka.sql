-- Quiver streaming job (Flink SQL); generated, do not edit.
SET 'table.local-time-zone' = 'UTC';
SET 'table.exec.mini-batch.enabled' = 'false';
SET 'table.exec.state.ttl' = '90300500 ms';
SET 'table.exec.uid.generation' = 'ALWAYS';
SET 'table.exec.source.idle-timeout' = '60000 ms';

CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS quiver_parse AS 'dev.quiver.jvm.parse.ParseRecord' LANGUAGE JAVA;

CREATE TABLE `src__clicks` (
  `line` STRING,
  `__rowtime` AS TO_TIMESTAMP_LTZ(CASE WHEN (quiver_parse(`line`, 'user_id:int64,qty:int64,amount:float64,cat:string')).`__ts_us` <= (UNIX_TIMESTAMP() + 1) * 1000000 + 300000000 THEN ((quiver_parse(`line`, 'user_id:int64,qty:int64,amount:float64,cat:string')).`__ts_us` - MOD(MOD((quiver_parse(`line`, 'user_id:int64,qty:int64,amount:float64,cat:string')).`__ts_us`, 1000) + 1000, 1000)) / 1000 ELSE 0 END, 3),
  WATERMARK FOR `__rowtime` AS `__rowtime` - INTERVAL '0 00:00:00.500' DAY TO SECOND(3)
) WITH (
  'connector' = 'kafka',
  'topic' = 'clicks',
  'properties.bootstrap.servers' = 'kafka:9092',
  'properties.group.id' = 'quiver.golden.clicks',
  'scan.startup.mode' = 'timestamp',
  'scan.startup.timestamp-millis' = '1796638500000',
  'properties.security.protocol' = 'SASL_SSL',
  'properties.sasl.mechanism' = 'SCRAM-SHA-512',
  'format' = 'raw'
);

CREATE TEMPORARY VIEW `clicks__parsed` AS
SELECT
  `__ts_us`,
  `__rowtime`,
  `user_id`,
  `qty`,
  `amount`,
  `cat`,
  `line`,
  CASE
      WHEN `__reason` IS NOT NULL THEN `__reason`
      WHEN `qty` < CAST(1 AS BIGINT) THEN 'min:qty'
      WHEN `qty` > CAST(5 AS BIGINT) THEN 'max:qty'
      WHEN (`amount` IS NOT NULL AND CASE WHEN ABS(`amount`) >= 0 THEN 0 ELSE 1 END = 1) OR abs(`amount`) = CAST('Infinity' AS DOUBLE) THEN 'finite:amount'
      WHEN `amount` < CAST('0.0' AS DOUBLE) OR (`amount` IS NOT NULL AND CASE WHEN ABS(`amount`) >= 0 THEN 0 ELSE 1 END = 1) THEN 'min:amount'
      WHEN `cat` NOT IN ('a', 'b') THEN 'one_of:cat'
      WHEN `__ts_us` < CAST(1793491200000000 AS BIGINT) THEN 'min:ts'
    END AS `__problem`,
  `__ts_us` IS NOT NULL AND NOT (`__ts_us` <= (UNIX_TIMESTAMP() + 1) * 1000000 + 300000000) AS `__future`
FROM (
  SELECT
    `line`,
    `__rowtime`,
    r.`__record`.`__reason` AS `__reason`,
    r.`__record`.`__ts_us` AS `__ts_us`,
    r.`__record`.`user_id` AS `user_id`,
    r.`__record`.`qty` AS `qty`,
    r.`__record`.`amount` AS `amount`,
    r.`__record`.`cat` AS `cat`
  FROM (SELECT `line`, `__rowtime`, quiver_parse(`line`, 'user_id:int64,qty:int64,amount:float64,cat:string') AS `__record` FROM `src__clicks`) AS r
);

CREATE TEMPORARY VIEW `clicks__events` AS
SELECT *
FROM `clicks__parsed`
WHERE `__problem` IS NULL
  AND NOT (`__future` OR (CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3)));

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
    AND (`__future` OR (CURRENT_WATERMARK(`__rowtime`) IS NOT NULL AND `__rowtime` <= CURRENT_WATERMARK(`__rowtime`) - INTERVAL '0 01:00:00.000' DAY TO SECOND(3)));
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
