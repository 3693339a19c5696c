-- Read by quiver/online/redis_scripts.py and bundled into the Flink sink (infra/jvm/redis-sink): the one copy.
-- Tile upsert: merge the stored and incoming records by tile_start (the fuller tile wins, ties go to the
-- incoming one), then trim tiles older than newest - horizon. ARGV: width, var_len offset (0: none),
-- horizon µs, then one value per key.
-- A few fixed-width records (no string partials; a stream's flush) change the value in place, unread:
-- moving a value through Lua (GET into a Lua string, SET back) costs ~3 ns a byte here, so a whole-value merge
-- of a key holding 200 tiles of 64 bytes costs 100 µs, 20× a key of 5 tiles. In place, a write reads a few 16-byte
-- heads (GETRANGE, a binary search when the tile is not the newest) and writes one record (SETRANGE, or
-- APPEND for a new newest tile); a tile inserted before the newest rewrites the records after it (a few,
-- when a merchant's events come from partitions a little apart in time), a trim the whole value.
-- Many incoming records, or records with string partials, go through one merge of the whole value.
local W, VO, H = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- Up to this many incoming fixed-width records change a value in place (a stream's flush: one or two);
-- more (a materialization's whole day) are merged in one pass over the whole value instead.
local IN_PLACE = 8
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
-- tile_start of stored record i (0-based) of `key`
local function head(key, i)
  return (struct.unpack('<i8', redis.call('GETRANGE', key, i * W, i * W + 7)))
end
-- tile_start, events and bytes of stored record i
local function record(key, i)
  local r = redis.call('GETRANGE', key, i * W, i * W + W - 1)
  local ts, ev = struct.unpack('<i8i8', r)
  return ts, ev, r
end
-- the first stored record with tile_start >= ts, in [lo, hi)
local function stored_at_least(key, lo, hi, ts)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if head(key, mid) < ts then lo = mid + 1 else hi = mid end
  end
  return lo
end
-- the in-place upsert of a few fixed-width records; true when the stored value changed
local function upsert(key, inc)
  local m = math.floor(#inc / W)
  local n = math.floor(redis.call('STRLEN', key) / W)
  if n == 0 then
    if #inc == 0 then return false end
    redis.call('SET', key, inc)
    return true
  end
  local last, last_ev, last_rec = record(key, n - 1)
  local newest = math.max(last, (struct.unpack('<i8', inc, (m - 1) * W + 1)))
  local changed = false
  for j = 0, m - 1 do
    local rec = string.sub(inc, j * W + 1, (j + 1) * W)
    local ts, ev = struct.unpack('<i8i8', rec)
    if ts > last then
      redis.call('APPEND', key, rec)
      n, last, last_ev, last_rec, changed = n + 1, ts, ev, rec, true
    elseif ts >= newest - H then  -- an older tile would be trimmed right away
      local at, found, stored_ev, stored = n - 1, last, last_ev, last_rec
      if ts < last then
        at = stored_at_least(key, 0, n - 1, ts)
        found, stored_ev, stored = record(key, at)
      end
      if found ~= ts then  -- a tile before the newest that was never stored: the records after it move up
        redis.call('SETRANGE', key, at * W, rec .. redis.call('GETRANGE', key, at * W, n * W - 1))
        n, changed = n + 1, true
      elseif ev >= stored_ev and rec ~= stored then
        redis.call('SETRANGE', key, at * W, rec)
        changed = true
        if at == n - 1 then last_ev, last_rec = ev, rec end
      end
    end
  end
  if n > 1 and head(key, 0) < newest - H then
    local keep = stored_at_least(key, 0, n, newest - H)
    redis.call('SET', key, redis.call('GETRANGE', key, keep * W, n * W - 1))
    changed = true
  end
  return changed
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
local w, whole = 0, {}
for i = 1, #KEYS do
  local inc = ARGV[i + 3]
  if VO == 0 and #inc <= IN_PLACE * W then
    if upsert(KEYS[i], inc) then w = w + 1 end
  else
    whole[#whole + 1] = i
  end
end
if #whole == 0 then return w end
local names = {}
for j, i in ipairs(whole) do names[j] = KEYS[i] end
local cur = redis.call('MGET', unpack(names))
local out = {}
for j, i in ipairs(whole) do
  local inc, c = ARGV[i + 3], cur[j]
  local value = inc
  if c then value = merge(c, inc) end
  if value ~= c and #value > 0 then
    out[#out + 1] = KEYS[i]
    out[#out + 1] = value
    w = w + 1
  end
end
if w > 0 and #out > 0 then redis.call('MSET', unpack(out)) end
return w
