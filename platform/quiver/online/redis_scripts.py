"""The Lua scripts of the Redis online store: every write is one atomic, idempotent script call.

Keys and values follow online/layout.py and online/codec.py; the store (redis_store.py) packs the calls.
"""

from __future__ import annotations

from typing import Final

# Newer wins: one MGET, compare the leading event_ts (i8), one MSET of the winners. Lua numbers are
# doubles, exact for epoch µs until the year 2255.
LAST_SCRIPT = b"""
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
"""

# Tile upsert: merge the stored and incoming records by tile_start (the fuller tile wins, ties go to the
# incoming one), then trim tiles older than newest - horizon. ARGV: width, var_len offset (0: none),
# horizon µs, then one value per key. Fixed-width records (no string partials, the common case) are
# spliced in place: a binary search per incoming record (usually one or two, at the end), never a pass
# over every stored tile in Lua; a merchant-like key holding hundreds of tiles costs the same as one.
TILE_SCRIPT = b"""
local W, VO, H = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function records(s)
  local out, pos, n = {}, 1, #s
  while pos + W - 1 <= n do
    local ts, ev = struct.unpack('<i8i8', s, pos)
    local size = W
    if VO > 0 then size = W + struct.unpack('<I4', s, pos + VO) end
    out[#out + 1] = {ts, ev, string.sub(s, pos, pos + size - 1)}
    pos = pos + size
  end
  return out
end
local function first_at_least(s, n, ts)
  local lo, hi = 0, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if struct.unpack('<i8', s, mid * W + 1) < ts then lo = mid + 1 else hi = mid end
  end
  return lo
end
local function splice(c, inc)
  local value = c
  for j = 0, math.floor(#inc / W) - 1 do
    local rec = string.sub(inc, j * W + 1, (j + 1) * W)
    local ts, ev = struct.unpack('<i8i8', rec)
    local n = math.floor(#value / W)
    local at = first_at_least(value, n, ts)
    local pos = at * W
    if at < n and struct.unpack('<i8', value, pos + 1) == ts then
      if ev >= struct.unpack('<i8', value, pos + 9) then
        value = string.sub(value, 1, pos) .. rec .. string.sub(value, pos + W + 1)
      end
    else
      value = string.sub(value, 1, pos) .. rec .. string.sub(value, pos + 1)
    end
  end
  local n = math.floor(#value / W)
  if n == 0 then return value end
  local keep = first_at_least(value, n, struct.unpack('<i8', value, (n - 1) * W + 1) - H)
  return string.sub(value, keep * W + 1, n * W)
end
local function merge(c, inc)
  local a, b = records(c), records(inc)
  local merged, ia, ib = {}, 1, 1
  while ia <= #a or ib <= #b do
    local ra, rb = a[ia], b[ib]
    if rb == nil or (ra ~= nil and ra[1] < rb[1]) then
      merged[#merged + 1] = ra
      ia = ia + 1
    elseif ra == nil or rb[1] < ra[1] then
      merged[#merged + 1] = rb
      ib = ib + 1
    else
      if rb[2] >= ra[2] then merged[#merged + 1] = rb else merged[#merged + 1] = ra end
      ia = ia + 1
      ib = ib + 1
    end
  end
  local parts = {}
  if #merged > 0 then
    local oldest = merged[#merged][1] - H
    for _, r in ipairs(merged) do
      if r[1] >= oldest then parts[#parts + 1] = r[3] end
    end
  end
  return table.concat(parts)
end
local cur = redis.call('MGET', unpack(KEYS))
local out, w = {}, 0
for i = 1, #KEYS do
  local inc, c = ARGV[i + 3], cur[i]
  local value = inc
  if c then
    if VO == 0 then value = splice(c, inc) else value = merge(c, inc) end
  end
  if value ~= c and #value > 0 then
    out[#out + 1] = KEYS[i]
    out[#out + 1] = value
    w = w + 1
  end
end
if w > 0 then redis.call('MSET', unpack(out)) end
return w
"""

# Freshness: keep the greatest event time ever written to a view, and when it was written.
META_SCRIPT = b"""
local cur = redis.call('HGET', KEYS[1], 'max_event_ts')
if (not cur) or tonumber(ARGV[1]) > tonumber(cur) then
  redis.call('HSET', KEYS[1], 'max_event_ts', ARGV[1])
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'updated_at_ms', string.format('%.0f', t[1] * 1000 + math.floor(t[2] / 1000)))
return 1
"""


SCRIPTS: Final = {"last": LAST_SCRIPT, "tile": TILE_SCRIPT, "meta": META_SCRIPT}
