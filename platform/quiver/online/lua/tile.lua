-- Read by quiver/online/redis_scripts.py and bundled into the Flink sink (infra/jvm/redis-sink): the one copy.
-- Tile upsert: merge the stored and incoming records by tile_start (the fuller tile wins, ties go to the
-- incoming one), then trim tiles older than newest - horizon. ARGV: width, var_len offset (0: none),
-- horizon µs, then one value per key. Fixed-width records (no string partials, the common case) are
-- spliced in place: a binary search per incoming record (usually one or two, at the end), never a pass
-- over every stored tile in Lua; a merchant-like key holding hundreds of tiles costs the same as one.
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
