-- Read by quiver/online/redis_scripts.py and bundled into the Flink sink (infra/jvm/redis-sink): the one copy.
-- Newer wins: one MGET, compare the leading event_ts (i8), one MSET of the winners. Lua numbers are
-- doubles, exact for epoch µs until the year 2255. KEYS: entity keys; ARGV: one packed record per key.
local cur = redis.call('MGET', unpack(KEYS))
local out, w = {}, 0
for i = 1, #KEYS do
  local v, c = ARGV[i], cur[i]
  if (not c) or #c < 8 or struct.unpack('<i8', v) >= struct.unpack('<i8', c) then
    out[#out + 1] = KEYS[i]
    out[#out + 1] = v
    w = w + 1
  end
end
if w > 0 then redis.call('MSET', unpack(out)) end
return w
