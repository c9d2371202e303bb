-- Tollgate: check every limit of one counter and count the hits only if all admit,
-- atomically, in Redis server time (microseconds). The same integer formulas as the Rust
-- algorithms (crates/tollgate-core/src/algo), so both give the same answer on the same
-- state; they are exact while the products below stay under 2^53. The caller holds every
-- count it sends (hits, debt) at 2^53 - 1 (MAX_UNITS in algo/mod.rs).
--
-- This script is the one definition of the counter's layout in Redis: one string per
-- counter, each limit's state in order as big-endian unsigned integers of fixed width
--   sliding: newest sub-window (6 bytes), the counts of the sub-windows before the oldest
--            (6), then its precision + 1 sub-windows, newest first: count * 256 + start
--            (5) and end (2);
--   fixed: window index (7), count (7);  calendar: the window's UTC start in µs (7),
--   count (7);  gcra: theoretical arrival time (7).
-- Why this layout: a call reads and writes the few numbers it needs where they lie, and
-- moves the rest as one piece of string, rather than unpacking every number into a table
-- and packing it back (that was two thirds of the script's time). Newest first, a window
-- that slides on drops its oldest sub-windows off the end; the kept sum spares adding up
-- the window on every call. Fixed widths need no check of what was read: any string of
-- the right length holds integers the loops below cannot run away on (a sub-window number
-- is below 2^48). A string of another length reads as no state.
-- A counter kept by the previous layout (MessagePack, under the key ending ':v2') is read
-- once, when its ':v3' key does not exist yet, so an upgrade keeps the counts.
--
-- A batch of calls, each on its own counter: one script call carries the calls of many
-- requests (all in one Cluster slot), so its fixed cost and Redis' reading and writing
-- of the command are paid once for all of them. Call i is KEYS[i] and ARGV[i].
--
-- KEYS[i]  the counter (ending ':v3')
-- ARGV[i]  the call, as a run of MessagePack values: mode ('c' consume; 'p' charge:
--          counted even past the limit; 'k' check: within the limits, at them included;
--          'r' refund; 'l' take a lease's block: the most units up to hits, and at
--          least extra, that fit, counted as consumed; 'g' give back hits units of a
--          block taken at extra µs, where they were counted if that still counts), hits,
--          debt (units this instance admitted while Redis did not answer: charged first,
--          as 'p'), deadline_us (0: none), now_us (0: Redis TIME; tests replay histories
--          at chosen instants), extra, then per limit: kind ('s' sliding, 'f' fixed, 'c'
--          calendar, 'g' gcra), window_us, precision or burst, requests_per_unit. A
--          calendar's window_us is an array of three boundaries (µs) the caller computed
--          around its own now: Redis picks the window holding its now, so it needs no
--          time-zone database. One argument read by one unpack.
-- Returns  one value per call, in order, then the calls whose keys held another type (for
--          each key that held another type than a string, read as no state and replaced
--          if the call writes: the call's number and "KEY held a TYPE"), then Redis' clock
--          (µs; 0 if no call read it). A call's value: the stored state as it was before
--          this call, before its debt too ('' if there was none), when the call was
--          admitted (flag 1); else an array of its flag (0 denied; for 'l' the units
--          taken, 0 for none) and that state; -1 if Redis ran this after the deadline and
--          changed nothing, the debt included. A call given its own now answers an array
--          of its flag, the state and that now. One flat array, and one value for most
--          calls: each value costs Redis time to answer (a table per call a quarter of a
--          microsecond; three values per admission instead of one 0.3).
--
-- Each Lua operation costs here what a few dozen arithmetic instructions do, and each
-- table or closure made costs its allocation and collection: the functions below are
-- made once per script call, and keep what a call needs in a few arrays they reuse.

local floor, max, min = math.floor, math.max, math.min
local sunpack, spack, rep, sub = struct.unpack, struct.pack, string.rep, string.sub
-- 2^53: below it every integer is exact. Stored counts and arrival times stay below it (a
-- count or an arrival time driven past it by huge charges is held just under it, which
-- denies as the true value would).
local EXACT = 9007199254740992
-- A counter's time to live at most (µs): two years, past any calendar window, so that a
-- stored value this script did not write cannot ask Redis for an expiry it refuses.
local LONGEST = 63072000000000
-- Bytes of a sliding window's head (newest, the kept sum) and of one of its sub-windows.
local HEAD, SLOT = 12, 7
-- The most a sub-window counts: the Rust u32, which denies as the true count would.
local MOST = 4294967295
-- The first argument of a call's limits.
local FIRST = 7

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

-- Redis' clock in microseconds, read once for every call of the batch: they all run
-- at this one instant, as far as any other caller can tell.
local time_us = nil
local function clock()
  if not time_us then
    local time = redis.call('TIME')
    time_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return time_us
end

-- Strings of n zero bytes, made once each.
local zero_strings = {}
local function zeros(n)
  local z = zero_strings[n]
  if not z then
    z = rep('\0', n)
    zero_strings[n] = z
  end
  return z
end

-- Whether v[1], v[2], ... are all integers in 0 .. 2^53; raises an error on anything but
-- numbers (run under pcall, which is cheaper than a type check per number).
local function integers(v)
  for j = 1, #v do
    local x = v[j]
    if x < 0 or x >= EXACT or x % 1 ~= 0 then return false end
  end
  return true
end

-- The state of the previous layout in raw (MessagePack: every limit's numbers in order,
-- a sliding window's ring indexed by sub-window number modulo its length, then each
-- sliding window's ring of ends, or none: every end unknown), in this layout; nil if raw
-- is not such a state.
local function upgraded(args, raw)
  local size, total = 0, 0
  for a = FIRST, #args, 4 do
    local kind = args[a]
    if kind == 's' then
      size = size + args[a + 2] + 2
      total = total + args[a + 2] + 1
    elseif kind == 'g' then size = size + 1 else size = size + 2 end
  end
  total = total + size
  if #raw > 9 * total then return nil end
  local v = { pcall(cmsgpack.unpack_limit, raw, total, 0) }
  if not v[1] or v[2] ~= -1 then return nil end
  table.remove(v, 1)
  table.remove(v, 1)
  if #v ~= total and #v ~= size then return nil end
  local read, valid = pcall(integers, v)
  if not (read and valid) then return nil end
  local parts = {}
  local b, e = 0, size
  for a = FIRST, #args, 4 do
    local kind, param = args[a], args[a + 2]
    if kind == 's' then
      local ring, newest = param + 1, v[b + 1]
      local recent, slots = 0, {}
      for age = 0, param do
        local j = (newest - age) % ring
        local x = v[b + 2 + j]
        local last = 65535
        if #v == total then last = min(v[e + 1 + j], 65535) end
        if age < param then recent = recent + (x - x % 256) / 256 end
        slots[age + 1] = spack('>I5I2', x, last)
      end
      parts[#parts + 1] = spack('>I6I6', newest, recent) .. table.concat(slots)
      b = b + param + 2
      e = e + param + 1
    elseif kind == 'g' then
      parts[#parts + 1] = spack('>I7', v[b + 1])
      b = b + 1
    else
      parts[#parts + 1] = spack('>I7I7', v[b + 1], v[b + 2])
      b = b + 2
    end
  end
  return table.concat(parts)
end

-- The count of the sub-window `age` sub-windows before the newest of the sliding window at
-- byte o of st.
local function count_at(st, o, age)
  local x = sunpack('>I5', st, o + HEAD + SLOT * age)
  return (x - x % 256) / 256
end

-- The sliding window at byte o of st (window and sub-window lengths in µs, param
-- sub-windows), seen at now: the sub-window now falls in (slot), how far into it (fine),
-- how many sub-windows it is past the newest stored (ahead), the counts of the window's
-- whole sub-windows (full), the oldest sub-window's count * 256 + start and end, and the
-- newest stored one's. Nil if the newest stored is more than a window ahead of now, which
-- this script never stores (a value put there by something else: read as no state).
local function sliding_at(st, o, now, sub_us, param)
  local newest, recent = sunpack('>I6I6', st, o)
  local slot = floor(now / sub_us)
  local into = now - slot * sub_us
  if slot < newest then
    if newest - slot > param then return nil end
    slot = newest
    into = 0
  end
  local ahead = slot - newest
  -- The kept sum of the param newest, less those the window slid past, or those it kept,
  -- whichever is fewer to read.
  local full = 0
  if ahead == 0 then
    full = recent
  elseif ahead < param then
    if ahead <= param - ahead then
      full = recent
      for age = param - ahead, param - 1 do full = full - count_at(st, o, age) end
    else
      for age = 0, param - 1 - ahead do full = full + count_at(st, o, age) end
    end
  end
  local oldest, last, first, first_end = 0, 0, 0, 0
  if ahead <= param then oldest, last = sunpack('>I5I2', st, o + HEAD + SLOT * (param - ahead)) end
  if ahead == 0 then first, first_end = sunpack('>I5I2', st, o + HEAD) end
  return slot, fraction(into, sub_us), ahead, full, oldest, last, first, first_end
end

-- Whether `asked` units fit rpu in a sliding window as sliding_at saw it:
-- full + asked + count * inside / (last - start) <= rpu, where inside is the part of
-- [start, last] of the oldest sub-window after fine; at last <= start, all of it while
-- fine < last (see crates/tollgate-core/src/algo/sliding.rs). Read as the Rust u32
-- count, the product below stays under 2^48.
local function sliding_fits(asked, rpu, full, fine, oldest, last)
  local start = oldest % 256
  local count = min((oldest - start) / 256, MOST)
  last = min(last, 65535)
  start = start * 256
  local room = rpu - full - asked
  if room < 0 then
    return false
  elseif last <= start then
    return not (fine < last and count > room)
  end
  return count * max(last - max(fine, start), 0) <= room * (last - start)
end

-- The sub-windows after the newest (newest first) of the sliding window at byte o of st,
-- once it slid `ahead` sub-windows on.
local function sliding_rest(st, o, param, ahead)
  local body, ring = o + HEAD, param + 1
  if ahead == 0 then
    return sub(st, body + SLOT, body + SLOT * ring - 1)
  elseif ahead < ring then
    return zeros(SLOT * (ahead - 1)) .. sub(st, body, body + SLOT * (ring - ahead) - 1)
  end
  return zeros(SLOT * param)
end

-- The newest sub-window (count * 256 + start, end) with hits counted at fine, and its
-- count before and after: the start is where its count reached two.
local function sliding_count(first, first_end, fine, hits, param)
  local start = first % 256
  local n = (first - start) / 256
  if n < 2 and param > 1 then start = floor(fine / 256) end
  local counted = min(n + hits, MOST)
  return counted * 256 + start, max(first_end, fine), n, counted
end

-- When a sliding window's key must expire, in µs: when its newest sub-window `slot` leaves
-- the window, rounded up to the whole second. So keys of short sub-windows keep their
-- expiry for a second of them (a new expiry is what costs most in writing a key), and
-- live at most a second longer than they must.
local function sliding_expiry(slot, sub_us, param)
  local at = (slot + param + 1) * sub_us
  local second = floor(at / 1000000)
  if second * 1000000 < at then second = second + 1 end
  return second * 1000000
end

-- One sliding window consumed without a debt, most calls: state st (or none, when raw
-- is false; kept: raw is the key's own value) at now; the flag, the new state if it
-- changed and how long it must live, and the state read (false if none). When the key's
-- expiry stays, how long it must live is `false`: the new state is written in place,
-- and counted in the sub-window last written, it is only the string's changed head.
local function consume(st, raw, kept, now, hits, window, param, rpu)
  local sub_us = window / param
  local slot, fine, ahead, full, oldest, last, first, first_end = sliding_at(st, 1, now, sub_us, param)
  if not slot then
    raw = false
    st = zeros(HEAD + SLOT * (param + 1))
    slot, fine, ahead, full, oldest, last, first, first_end = sliding_at(st, 1, now, sub_us, param)
  end
  if not sliding_fits(hits, rpu, full, fine, oldest, last) then return 0, nil, 0, raw end
  local n, counted
  first, first_end, n, counted = sliding_count(first, first_end, fine, hits, param)
  local head = spack('>I6I6I5I2', slot, full - n + counted, first, first_end)
  if kept and ahead == 0 then return 1, head, false, raw end
  local new = head .. sliding_rest(st, 1, param, ahead)
  local expires = sliding_expiry(slot, sub_us, param)
  if kept and expires == sliding_expiry(slot - ahead, sub_us, param) then return 1, new, false, raw end
  return 1, new, expires - now, raw
end

-- What the limits see of a state at an instant, limit i at index i; filled by look.
-- Sliding: the sub-window now falls in (slot), how far into it (fine), how many
-- sub-windows it is past the newest stored (ahead), the counts of the window's whole
-- sub-windows (full), the oldest sub-window's count * 256 + start (oldest) and end (last),
-- and the newest stored one's (first, first_end). Fixed and calendar: the window (slot)
-- and its count (full). Gcra: the arrival time (full).
local kinds, offsets, windows, params, rpus = {}, {}, {}, {}, {}
local slots, fines, aheads, fulls, oldests, lasts, firsts, first_ends = {}, {}, {}, {}, {}, {}, {}, {}
local limits = 0

-- The limits of args, into kinds ... rpus; the length of their state.
local function describe(args)
  limits = 0
  local at = 1
  for a = FIRST, #args, 4 do
    limits = limits + 1
    local kind, param = args[a], args[a + 2]
    kinds[limits], windows[limits], params[limits], rpus[limits] = kind, args[a + 1], param, args[a + 3]
    offsets[limits] = at
    if kind == 's' then
      at = at + HEAD + SLOT * (param + 1)
    elseif kind == 'g' then
      at = at + 7
    else
      at = at + 14
    end
  end
  return at - 1
end

-- What every limit sees of state st at now (see kinds ... first_ends); false if st holds a
-- window ahead of now that this script never stores (see sliding_at).
local function look(st, now)
  for i = 1, limits do
    local kind, o, window, param = kinds[i], offsets[i], windows[i], params[i]
    if kind == 's' then
      local slot, fine, ahead, full, oldest, last, first, first_end = sliding_at(st, o, now, window / param, param)
      if not slot then return false end
      slots[i], fines[i], aheads[i], fulls[i] = slot, fine, ahead, full
      oldests[i], lasts[i], firsts[i], first_ends[i] = oldest, last, first, first_end
    elseif kind == 'g' then
      fulls[i] = sunpack('>I7', st, o)
    else
      local stored, count = sunpack('>I7I7', st, o)
      local w
      local ahead
      if kind == 'f' then
        w = floor(now / window)
        ahead = stored > w + 1
      elseif now < window[2] then
        -- Named by its start. A clock more than half a window off the caller's falls
        -- outside the boundaries and counts in the nearest window.
        w = window[1]
        ahead = stored > window[3]
      else
        w = window[2]
        ahead = stored > window[3]
      end
      if ahead then return false end
      if w <= stored then w = stored else count = 0 end
      slots[i], fulls[i] = w, count
    end
  end
  return true
end

-- Whether `asked` units fit every limit as look saw them at now.
local function fits(asked, now)
  for i = 1, limits do
    local kind, rpu = kinds[i], rpus[i]
    if kind == 's' then
      if not sliding_fits(asked, rpu, fulls[i], fines[i], oldests[i], lasts[i]) then return false end
    elseif kind == 'g' then
      local window, param = windows[i], params[i]
      -- More units than the burst, counted apart: their span can round to the burst's.
      if rpu == 0 or asked > param then return false end
      if max(fulls[i] - now, 0) + muldiv(asked, window, rpu) > muldiv(param, window, rpu) then
        return false
      end
    elseif fulls[i] + asked > rpu then
      return false
    end
  end
  return true
end

-- The most units from need to want that fit, by the bisection of the Rust `take`
-- (store/shared/protocol.rs), so that both find the same number; 0 if need does not fit.
local function most(need, want, now)
  if fits(want, now) then return want end
  if need == 0 or not fits(need, now) then return 0 end
  local lo, hi = need, want
  while hi - lo > 1 do
    local mid = lo + floor((hi - lo) / 2)
    if fits(mid, now) then lo = mid else hi = mid end
  end
  return lo
end

-- Each limit's new state, in order.
local parts = {}

-- State st as look saw it at now, with mode's hits counted or given back (extra as the
-- call gave it); the new state and how long it must live (µs).
local function count(st, now, mode, hits, extra)
  local ttl = 0
  for i = 1, limits do
    local kind, o, window, param = kinds[i], offsets[i], windows[i], params[i]
    local expires
    if kind == 's' then
      local sub_us, slot = window / param, slots[i]
      local rest = sliding_rest(st, o, param, aheads[i])
      local first, first_end = firsts[i], first_ends[i]
      local recent = fulls[i]
      if mode == 'c' or mode == 'p' then
        local n, counted
        first, first_end, n, counted = sliding_count(first, first_end, fines[i], hits, param)
        recent = recent - n + counted
      elseif mode == 'g' then
        -- Given back where the block was taken, if that sub-window still counts.
        local taken = floor(extra / sub_us)
        if taken <= slot and slot - taken <= param then
          local age = slot - taken
          if age == 0 then
            local n = (first - first % 256) / 256
            local back = min(hits, n)
            first = first - back * 256
            recent = recent - back
          else
            local at = SLOT * (age - 1) + 1
            local x, e = sunpack('>I5I2', rest, at)
            local back = min(hits, (x - x % 256) / 256)
            rest = sub(rest, 1, at - 1) .. spack('>I5I2', x - back * 256, e) .. sub(rest, at + SLOT)
            if age < param then recent = recent - back end
          end
        end
      else
        -- A refund: taken from the newest sub-windows back.
        local n = (first - first % 256) / 256
        local back = min(hits, n)
        first = first - back * 256
        recent = recent - back
        local left = hits - back
        local age = 1
        while left > 0 and age <= param do
          local at = SLOT * (age - 1) + 1
          local x, e = sunpack('>I5I2', rest, at)
          local taken = min(left, (x - x % 256) / 256)
          if taken > 0 then
            rest = sub(rest, 1, at - 1) .. spack('>I5I2', x - taken * 256, e) .. sub(rest, at + SLOT)
            if age < param then recent = recent - taken end
            left = left - taken
          end
          age = age + 1
        end
      end
      parts[i] = spack('>I6I6I5I2', slot, recent, first, first_end) .. rest
      -- What look now sees, should a second step follow (a debt, then the call).
      aheads[i], fulls[i], firsts[i], first_ends[i] = 0, recent, first, first_end
      oldests[i], lasts[i] = sunpack('>I5I2', rest, SLOT * (param - 1) + 1)
      expires = sliding_expiry(slot, sub_us, param)
    elseif kind == 'g' then
      local rpu, tat = rpus[i], fulls[i]
      if rpu > 0 then
        local span = muldiv(hits, window, rpu)
        -- A give-back leaves the arrival time alone (lease.rs says why).
        if mode == 'r' then
          tat = max(tat - span, now)
        elseif mode ~= 'g' then
          tat = min(max(tat, now) + span, EXACT - 1)
        end
        expires = tat
      else
        expires = now
      end
      fulls[i] = tat
      parts[i] = spack('>I7', tat)
    else
      local w, n = slots[i], fulls[i]
      if mode == 'g' then
        if kind == 'f' and floor(extra / window) == w then n = max(n - hits, 0) end
      elseif mode ~= 'r' then
        n = min(n + hits, EXACT - 1)
      else
        n = max(n - hits, 0)
      end
      fulls[i] = n
      parts[i] = spack('>I7I7', w, n)
      if kind == 'f' then
        expires = (w + 1) * window
      elseif w < window[2] then
        expires = window[2]
      elseif w < window[3] then
        expires = window[3]
      else
        -- A later window than the caller knows (Redis' clock stepped back): no calendar
        -- window is longer than two.
        expires = w + window[3] - window[1]
      end
    end
    ttl = max(ttl, expires - now)
  end
  if limits == 1 then return parts[1], ttl end
  return table.concat(parts, '', 1, limits), ttl
end

-- The replies of the batch, and the keys found holding another type.
local replies, foreign = {}, {}

-- The state of call i's counter key for the limits of args (unpacked, or still packed:
-- only an upgrade needs them): its stored string if it has the limits' length, a counter
-- of the previous layout moved to this one, or false; and whether it is the key's own
-- value.
local function read(i, key, args, total)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    -- WRONGTYPE: a list, a hash... put there by something else. Read as no state, and
    -- overwritten by the SET below, rather than failing every call on this counter.
    foreign[#foreign + 1] = i
    foreign[#foreign + 1] = key .. ' held a ' .. redis.call('TYPE', key).ok
    return false
  elseif not raw then
    local old = redis.pcall('GET', sub(key, 1, -4) .. ':v2')
    if type(old) ~= 'string' then return false end
    if type(args) == 'string' then args = { cmsgpack.unpack(args) } end
    raw = upgraded(args, old)
    if raw and #raw == total then return raw, false end
    return false
  end
  if #raw == total then return raw, true end
  return false
end

-- Any call on the limits describe read, state st (or none, when raw is false) at now; as
-- consume answers.
local function any(st, raw, total, now, mode, hits, debt, extra)
  if not look(st, now) then
    raw = false
    st = zeros(total)
    look(st, now)
  end
  local new, ttl = nil, 0
  -- A debt is charged before the call's own step, as if it had been counted when its
  -- units were admitted.
  if debt > 0 then new, ttl = count(st, now, 'p', debt, extra) end
  st = new or st
  local flag
  if mode == 'l' then
    flag = most(extra, hits, now)
    if flag > 0 then new, ttl = count(st, now, 'c', flag, extra) end
  elseif mode == 'k' or mode == 'r' or mode == 'g' then
    flag = fits(0, now) and 1 or 0
    if mode ~= 'k' then new, ttl = count(st, now, mode, hits, extra) end
    if mode == 'g' then flag = 1 end
  else
    flag = fits(hits, now) and 1 or 0
    if flag == 1 or mode == 'p' then new, ttl = count(st, now, mode, hits, extra) end
  end
  return flag, new, ttl, raw
end

-- Call i: counter key, its arguments packed; its reply into replies. Most calls consume
-- from one sliding window: their arguments are read into locals, without a table.
local function run(i, key, packed)
  local mode, hits, debt, deadline, now, extra, kind, window, param, rpu, more = cmsgpack.unpack(packed)
  local given = now ~= 0
  if not given then now = clock() end
  if deadline > 0 and now > deadline then
    replies[i] = given and { -1, '', now } or -1
    return
  end

  local one = more == nil and kind == 's' and mode == 'c' and debt == 0
  local total, args
  if one then
    total = HEAD + SLOT * (param + 1)
  else
    args = { cmsgpack.unpack(packed) }
    total = describe(args)
  end
  local raw, kept = read(i, key, args or packed, total)
  local st = raw or zeros(total)
  local flag, new, ttl
  if one then
    flag, new, ttl, raw = consume(st, raw, kept, now, hits, window, param, rpu)
  else
    flag, new, ttl, raw = any(st, raw, total, now, mode, hits, debt, extra)
  end
  if new then
    if not ttl then
      -- In place: the value keeps its length, the key its expiry.
      redis.call('SETRANGE', key, 0, new)
    elseif ttl > 0 then
      redis.call('SET', key, new, 'PX', floor((min(ttl, LONGEST) + 999) / 1000))
    else
      redis.call('DEL', key)
    end
  end
  raw = raw or ''
  if given then
    replies[i] = { flag, raw, now }
  elseif flag == 1 then
    replies[i] = raw
  else
    replies[i] = { flag, raw }
  end
end

for i = 1, #KEYS do run(i, KEYS[i], ARGV[i]) end
replies[#KEYS + 1] = foreign
replies[#KEYS + 2] = time_us or 0
return replies
