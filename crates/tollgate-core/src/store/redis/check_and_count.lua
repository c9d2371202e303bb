-- Tollgate: check every limit of one counter and count the hits only if all admit,
-- atomically, in Redis server time (microseconds). The same integer formulas as the Rust
-- algorithms (crates/tollgate-core/src/algo), so both give the same answer on the same
-- state; they are exact while the products below stay under 2^53.
--
-- This script is the one definition of the counter's layout in Redis: one hash per counter,
-- fields "<limit>:<name>" per limit. The reply carries the state positionally, so no
-- field name appears anywhere else.
--
-- KEYS[1]  the counter
-- ARGV     mode ('c' consume; 'p' charge: counted even past the limit; 'k' check;
--          'r' refund), hits, deadline_us (0: none), now_us
--          (0: Redis TIME; tests replay histories at chosen instants), number of limits,
--          then per limit: kind ('s' sliding, 'f' fixed, 'g' gcra), window_us,
--          precision or burst, requests_per_unit
-- Returns  {admitted (1/0; -1 if Redis ran this after the deadline and changed nothing),
--           now_us, then per limit the state as it was before this call:
--           sliding: newest sub-window, then the ring of precision + 1 counts;
--           fixed: window index, count; gcra: theoretical arrival time}

local key = KEYS[1]
local mode, hits, deadline = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, n = tonumber(ARGV[4]), tonumber(ARGV[5])
if now == 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
if deadline > 0 and now > deadline then return { -1, now } end

-- Library functions as locals, and field names built from digit strings: in Redis's Lua a
-- global lookup costs more than the arithmetic, and turning a number into a string (each
-- `name .. n`) costs about half a microsecond, more than anything else the script does.
local floor, max, min = math.floor, math.max, math.min
local DIGITS = { [0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9' }
-- prefix .. s for s = 0 .. last, each made from a shorter one and one digit.
local function names(prefix, last)
  local t = {}
  for s = 0, last do
    if s < 10 then t[s] = prefix .. DIGITS[s] else t[s] = t[floor(s / 10)] .. DIGITS[s % 10] end
  end
  return t
end

local raw = redis.call('HGETALL', key)
local f = {}
for i = 1, #raw, 2 do f[raw[i]] = tonumber(raw[i + 1]) end
local function get(name) return f[name] or 0 end

-- floor(a * b / c) for integers, exact while a * b < 2^53: the float quotient is corrected
-- by at most one step there (beyond, corrections could not terminate, so none is made).
local function muldiv(a, b, c)
  local p = a * b
  local q = floor(p / c)
  if p < 9007199254740992 then
    if q * c > p then q = q - 1 elseif (q + 1) * c <= p then q = q + 1 end
  end
  return q
end

-- floor(part * 65536 / whole) for 0 <= part < whole, by long division: exact for any
-- whole below 2^52.
local function fraction(part, whole)
  local q, r = 0, part
  for _ = 1, 16 do
    r = r * 2
    q = q * 2
    if r >= whole then r = r - whole; q = q + 1 end
  end
  return q
end

local asked = hits
if mode == 'k' then asked = 1 elseif mode == 'r' then asked = 0 end

local admitted = true
local limits = {}
local reply = { 0, now }
for i = 0, n - 1 do
  local a = 6 + i * 4
  -- Every field named in the constructor, so the table is made at its full size once
  -- (growing it field by field costs more than the arithmetic).
  local l = { kind = ARGV[a], window = tonumber(ARGV[a + 1]), param = tonumber(ARGV[a + 2]),
              rpu = tonumber(ARGV[a + 3]), p = false, ring = false, sub = false,
              newest = false, names = false, vals = false, slot = false, fine = false,
              stored = false, count = false, w = false, tat = false }
  l.p = names('', i)[i] .. ':'
  limits[#limits + 1] = l
  if l.kind == 's' then
    -- Each sub-window field holds count * 256 + start (where its count reached two, in
    -- 1/256ths of the sub-window); see crates/tollgate-core/src/algo/sliding.rs.
    l.ring = l.param + 1
    l.sub = l.window / l.param
    l.newest = get(l.p .. 'n')
    reply[#reply + 1] = l.newest
    l.vals = {}
    l.names = names(l.p, l.param)
    for s = 0, l.param do
      local v = get(l.names[s])
      l.vals[s] = v
      reply[#reply + 1] = v
    end
    l.slot = floor(now / l.sub)
    local into = now - l.slot * l.sub
    if l.slot < l.newest then l.slot = l.newest; into = 0 end
    l.fine = fraction(into, l.sub)
    local newest, param, ring, vals = l.newest, l.param, l.ring, l.vals
    local function packed(s)
      if s <= newest and newest - s <= param then return vals[s % ring] end
      return 0
    end
    local full = 0
    for s = l.slot - param + 1, l.slot do full = full + floor(packed(s) / 256) end
    local oldest = packed(l.slot - param)
    local denominator = 65536 - (oldest % 256) * 256
    local left = min(65536 - l.fine, denominator)
    -- full + asked + count * left / denominator <= rpu
    local room = l.rpu - full - asked
    if room < 0 or floor(oldest / 256) * left > room * denominator then
      admitted = false
    end
  elseif l.kind == 'f' then
    l.stored = get(l.p .. 'w')
    l.count = get(l.p .. 'c')
    reply[#reply + 1] = l.stored
    reply[#reply + 1] = l.count
    l.w = floor(now / l.window)
    if l.w <= l.stored then l.w = l.stored else l.count = 0 end
    if l.count + asked > l.rpu then admitted = false end
  else
    l.tat = get(l.p .. 't')
    reply[#reply + 1] = l.tat
    if l.rpu == 0 then
      admitted = false
    else
      local used = max(l.tat - now, 0)
      if used + muldiv(asked, l.window, l.rpu) > muldiv(l.param, l.window, l.rpu) then
        admitted = false
      end
    end
  end
end

-- Write: count admitted (or charged) hits, or give hits back. Fields to drop and to set
-- are gathered, so that the writes are one HDEL and one HSET whatever the limits.
if (admitted and mode == 'c') or mode == 'p' or mode == 'r' then
  local ttl, drop, set = 0, {}, {}
  for _, l in ipairs(limits) do
    local expires
    if l.kind == 's' then
      local vals = l.vals
      if l.slot > l.newest then
        for s = max(l.newest + 1, l.slot - l.param), l.slot do
          local slot = s % l.ring
          if vals[slot] ~= 0 then drop[#drop + 1] = l.names[slot]; vals[slot] = 0 end
        end
        set[#set + 1] = l.p .. 'n'
        set[#set + 1] = l.slot
        l.newest = l.slot
      end
      if mode ~= 'r' then
        local slot = l.slot % l.ring
        local v = vals[slot]
        local count, start = floor(v / 256), v % 256
        if count < 2 and l.param > 1 then start = floor(l.fine / 256) end
        set[#set + 1] = l.names[slot]
        set[#set + 1] = string.format('%.0f', (count + hits) * 256 + start)
      else
        local left = hits
        for s = l.slot, l.slot - l.param, -1 do
          local slot = s % l.ring
          local v = vals[slot]
          local take = min(left, floor(v / 256))
          if take > 0 then
            set[#set + 1] = l.names[slot]
            set[#set + 1] = string.format('%.0f', v - take * 256)
          end
          left = left - take
        end
      end
      expires = (l.newest + l.param + 1) * l.sub
    elseif l.kind == 'f' then
      local c = l.count
      if mode ~= 'r' then c = c + hits else c = max(c - hits, 0) end
      set[#set + 1] = l.p .. 'w'
      set[#set + 1] = l.w
      set[#set + 1] = l.p .. 'c'
      set[#set + 1] = c
      expires = (l.w + 1) * l.window
    elseif l.rpu > 0 then
      local span = muldiv(hits, l.window, l.rpu)
      local tat
      if mode ~= 'r' then tat = max(l.tat, now) + span else tat = max(l.tat - span, now) end
      set[#set + 1] = l.p .. 't'
      set[#set + 1] = string.format('%.0f', tat)
      expires = tat
    else
      expires = now
    end
    ttl = max(ttl, expires - now)
  end
  if ttl > 0 then
    if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
    if #set > 0 then redis.call('HSET', key, unpack(set)) end
    redis.call('PEXPIRE', key, math.ceil(ttl / 1000))
  else
    redis.call('DEL', key)
  end
end

if admitted then reply[1] = 1 end
return reply
