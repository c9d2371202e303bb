-- Tollgate: check every limit of one counter and count the hits only if all admit,
-- atomically, in Redis server time (microseconds). The same integer formulas as the Rust
-- algorithms (crates/tollgate-core/src/algo), so both give the same answer on the same
-- state; they are exact while the products below stay under 2^53.
--
-- This script is the one definition of the counter's layout in Redis: one string per
-- counter, the state of its limits in order as MessagePack integers
--   sliding: newest sub-window, then the ring of precision + 1 counts;
--   fixed: window index, count;  gcra: theoretical arrival time.
-- One GET and one SET, and no number turned into text or back: what a hash of fields
-- cost in field names and tonumber calls was half of the script's time. MessagePack
-- rather than fixed-width integers: an empty sub-window takes one byte, so a counter
-- takes less room in Redis than the hash did.
--
-- KEYS[1]  the counter
-- ARGV     mode ('c' consume; 'p' charge: counted even past the limit; 'k' check;
--          'r' refund), hits, deadline_us (0: none), now_us
--          (0: Redis TIME; tests replay histories at chosen instants), number of limits,
--          then per limit: kind ('s' sliding, 'f' fixed, 'g' gcra), window_us,
--          precision or burst, requests_per_unit
-- Returns  {admitted (1/0; -1 if Redis ran this after the deadline and changed nothing),
--           now_us, the stored state as it was before this call ('' if there was none)}

local key = KEYS[1]
local mode, hits, deadline = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, n = tonumber(ARGV[4]), tonumber(ARGV[5])
if now == 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
if deadline > 0 and now > deadline then return { -1, now, '' } end

-- Library functions as locals: in Redis's Lua a global lookup costs more than the
-- arithmetic.
local floor, max, min = math.floor, math.max, math.min
-- 2^53: below it every integer is exact. Stored numbers stay below it (a count or an
-- arrival time driven past it by huge charges is held just under it, which denies as the
-- true value would), so that a value read back past it cannot be one this script wrote.
local EXACT = 9007199254740992

-- floor(a * b / c) for integers, exact while a * b < 2^53: the float quotient is corrected
-- by at most one step there (beyond, corrections could not terminate, so none is made).
local function muldiv(a, b, c)
  local p = a * b
  local q = floor(p / c)
  if p < EXACT then
    if q * c > p then q = q - 1 elseif (q + 1) * c <= p then q = q + 1 end
  end
  return q
end

-- floor(part * 65536 / whole) for 0 <= part < whole: muldiv where that is exact, else by
-- long division (exact for any whole below 2^52).
local function fraction(part, whole)
  if part < 137438953472 and whole == floor(whole) then return muldiv(part, 65536, whole) end
  local q, r = 0, part
  for _ = 1, 16 do
    r = r * 2
    q = q * 2
    if r >= whole then r = r - whole; q = q + 1 end
  end
  return q
end

-- Each limit's count of numbers. A stored value this layout cannot have written (not
-- MessagePack, too long, another count, anything but integers in 0 .. 2^53) reads as no
-- state: past 2^53 a loop counter stops moving, and a loop over it would never end.
local lengths, size = {}, 0
for i = 1, n do
  local a = 2 + i * 4
  local kind, len = ARGV[a], 1
  if kind == 's' then len = tonumber(ARGV[a + 2]) + 2 elseif kind == 'f' then len = 2 end
  lengths[i] = len
  size = size + len
end
local raw = redis.call('GET', key)
if raw and #raw > 9 * size then raw = false end
local states, offset = {}, 0
if raw then
  for i = 1, n do
    -- {ok, the offset after these numbers (-1 at the end of the value), the numbers}
    local len = lengths[i]
    local got = { pcall(cmsgpack.unpack_limit, raw, len, offset) }
    if not got[1] or #got ~= len + 2 or (got[2] == -1) ~= (i == n) then
      raw = false
      break
    end
    offset = got[2]
    local state = {}
    for j = 1, len do
      local v = got[j + 2]
      if type(v) ~= 'number' or v < 0 or v >= EXACT or v ~= floor(v) then
        raw = false
      end
      state[j] = v
    end
    states[i] = state
  end
end
if not raw then
  for i = 1, n do
    local state = {}
    for j = 1, lengths[i] do state[j] = 0 end
    states[i] = state
  end
end

local asked = hits
if mode == 'k' then asked = 1 elseif mode == 'r' then asked = 0 end

-- Check: per limit, the sub-window or window this call falls in, and the time into it.
local admitted = true
local slots, fines = {}, {}
for i = 1, n do
  local a = 2 + i * 4
  local kind, window, param, rpu = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local state = states[i]
  if kind == 's' then
    -- state[1] is the newest sub-window s written, state[2 + s % ring] its count * 256 +
    -- start (where its count reached two, in 1/256ths of the sub-window); see
    -- crates/tollgate-core/src/algo/sliding.rs. Sub-windows older than newest - param
    -- are stale and count as empty; newest <= slot.
    local ring, sub, newest = param + 1, window / param, state[1]
    local slot = floor(now / sub)
    local into = now - slot * sub
    if slot < newest then slot = newest; into = 0 end
    local fine = fraction(into, sub)
    slots[i], fines[i] = slot, fine
    local full = 0
    for s = slot - param + 1, newest do
      full = full + floor(state[2 + s % ring] / 256)
    end
    local oldest = 0
    if slot - param <= newest then
      oldest = state[2 + (slot - param) % ring]
    end
    local denominator = 65536 - (oldest % 256) * 256
    local left = min(65536 - fine, denominator)
    -- full + asked + count * left / denominator <= rpu
    local room = rpu - full - asked
    if room < 0 or floor(oldest / 256) * left > room * denominator then
      admitted = false
    end
  elseif kind == 'f' then
    local w, count = floor(now / window), state[2]
    if w <= state[1] then w = state[1] else count = 0 end
    slots[i], state[2] = w, count
    if count + asked > rpu then admitted = false end
  elseif rpu == 0 then
    admitted = false
  else
    local used = max(state[1] - now, 0)
    if used + muldiv(asked, window, rpu) > muldiv(param, window, rpu) then
      admitted = false
    end
  end
end

-- Write: count admitted (or charged) hits, or give hits back; the key lives until its
-- last limit forgets them.
if (admitted and mode == 'c') or mode == 'p' or mode == 'r' then
  local ttl, parts = 0, {}
  for i = 1, n do
    local a = 2 + i * 4
    local kind, window, param, rpu = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local state = states[i]
    local expires
    if kind == 's' then
      local ring, sub, newest, slot = param + 1, window / param, state[1], slots[i]
      if slot > newest then
        for s = max(newest + 1, slot - param), slot do state[2 + s % ring] = 0 end
        newest = slot
        state[1] = slot
      end
      if mode ~= 'r' then
        local j = 2 + slot % ring
        local count, start = floor(state[j] / 256), state[j] % 256
        if count < 2 and param > 1 then start = floor(fines[i] / 256) end
        state[j] = min((count + hits) * 256 + start, EXACT - 1)
      else
        local left = hits
        for s = slot, slot - param, -1 do
          local j = 2 + s % ring
          local take = min(left, floor(state[j] / 256))
          state[j] = state[j] - take * 256
          left = left - take
        end
      end
      expires = (newest + param + 1) * sub
    elseif kind == 'f' then
      local w = slots[i]
      state[1] = w
      if mode ~= 'r' then state[2] = min(state[2] + hits, EXACT - 1) else state[2] = max(state[2] - hits, 0) end
      expires = (w + 1) * window
    elseif rpu > 0 then
      local span, tat = muldiv(hits, window, rpu), state[1]
      if mode ~= 'r' then tat = min(max(tat, now) + span, EXACT - 1) else tat = max(tat - span, now) end
      state[1] = tat
      expires = tat
    else
      expires = now
    end
    ttl = max(ttl, expires - now)
    parts[i] = cmsgpack.pack(unpack(state))
  end
  if ttl > 0 then
    redis.call('SET', key, table.concat(parts), 'PX', math.ceil(ttl / 1000))
  else
    redis.call('DEL', key)
  end
end

return { admitted and 1 or 0, now, raw or '' }
