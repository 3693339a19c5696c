-- Read by quiver/online/redis_scripts.py and bundled into the Flink sink (infra/jvm/redis-sink): the one copy.
-- Freshness: keep the greatest event time ever written to a view, and when it was written.
-- KEYS[1]: the view's meta hash; ARGV[1]: max_event_ts (epoch µs).
local cur = redis.call('HGET', KEYS[1], 'max_event_ts')
if (not cur) or tonumber(ARGV[1]) > tonumber(cur) then
  redis.call('HSET', KEYS[1], 'max_event_ts', ARGV[1])
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'updated_at_ms', string.format('%.0f', t[1] * 1000 + math.floor(t[2] / 1000)))
return 1
