-- Tollgate: check every limit of one counter and count the hits only if all admit,
-- atomically, in Redis server time (microseconds). The same integer formulas as the Rust
-- algorithms (crates/tollgate-core/src/algo), so both give the same answer on the same
-- state; they are exact while the products below stay under 2^53. The caller holds every
-- count it sends (hits, debt) at 2^53 - 1 (MAX_UNITS in algo/mod.rs).
--
-- This script is the one definition of the counter's layout in Redis: one string per
-- counter, the state of its limits in order as MessagePack integers
--   sliding: newest sub-window, then the ring of precision + 1 counts;
--   fixed: window index, count;  calendar: the window's UTC start (µs), count;
--   gcra: theoretical arrival time;
-- then, per sliding limit in order, the ring of its sub-windows' ends. A state without
-- the ends (stored before they were kept) is read with every end at 65535.
-- One GET and one SET, and no number turned into text or back: what a hash of fields
-- cost in field names and tonumber calls was half of the script's time. MessagePack
-- rather than fixed-width integers: an empty sub-window takes one byte, so a counter
-- takes less room in Redis than the hash did.
--
-- A batch of calls, each on its own counter: one script call carries the calls of many
-- requests (all in one Cluster slot), so its fixed cost and Redis' reading and writing
-- of the command are paid once for all of them. Call i is KEYS[i] and ARGV[i].
--
-- KEYS[i]  the counter
-- ARGV[i]  the call, as a run of MessagePack values: mode ('c' consume; 'p' charge:
--          counted even past the limit; 'k' check: within the limits, at them included;
--          'r' refund; 'l' take a lease's block: the most units up to hits, and at
--          least extra, that fit, counted as consumed; 'g' give back hits units of a
--          block taken at extra µs, where they were counted if that still counts), hits,
--          debt (units this instance admitted while Redis did not answer: charged first,
--          as 'p'), deadline_us (0: none), now_us (0: Redis TIME; tests replay histories
--          at chosen instants), extra, then per limit: kind ('s' sliding, 'f' fixed, 'c' calendar, 'g'
--          gcra), window_us, precision or burst, requests_per_unit. A calendar's window_us
--          is an array of three boundaries (µs) the caller computed around its own now:
--          Redis picks the window holding its now, so it needs no time-zone database. One argument read by one unpack: a
--          dozen arguments, each made a Lua string by Redis and a number by tonumber,
--          cost a third of the script's time.
-- Returns  per call, in order, {admitted (1/0; for 'l' the units taken, 0 for none; -1 if Redis ran this after the deadline and changed nothing,
--           the debt included), now_us, the stored state as it was before this call,
--           before its debt too ('' if there was none), and if the key held another
--           type than a string (read as no state, replaced if this call writes), the key
--           and that type, as text ('' otherwise)}
--
-- Each Lua operation costs here what a few dozen arithmetic instructions do, and each
-- call into a library function more: the loops below are written for the fewest of both
-- (library functions as locals, x - x % 256 for 256 * floor(x / 256), one table of
-- numbers for every limit).

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

-- Whether v[3], v[4], ... are all integers in 0 .. 2^53; raises an error on anything but
-- numbers (run under pcall, which is cheaper than a type check per number).
local function integers(v)
  for j = 3, #v do
    local x = v[j]
    if x < 0 or x >= EXACT or x % 1 ~= 0 then return false end
  end
  return true
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

-- One call on counter `key`, its arguments `packed`; its reply.
local function run(key, packed)
  -- args[a .. a + 3] for a = FIRST, FIRST + 4, ...: one limit each.
  local args = { cmsgpack.unpack(packed) }
  local mode, hits, debt, deadline, now, extra = args[1], args[2], args[3], args[4], args[5], args[6]
  local FIRST = 7
  if now == 0 then now = clock() end
  if deadline > 0 and now > deadline then return { -1, now, '', '' } end

  -- How many numbers the limits keep, before the sliding windows' ends, and with them.
  local size, total = 0, 0
  for a = FIRST, #args, 4 do
    local kind = args[a]
    if kind == 's' then
      size = size + args[a + 2] + 2
      total = total + args[a + 2] + 1
    elseif kind == 'f' or kind == 'c' then size = size + 2 else size = size + 1 end
  end
  total = total + size

  -- v: {ok, offset, then every limit's numbers in order} as unpacked, limit by limit from
  -- v[3] on. A stored value this layout cannot have written (not MessagePack, too long,
  -- another count, anything but integers in 0 .. 2^53) reads as no state: past 2^53 a loop
  -- counter stops moving, and a loop over it would never end.
  local raw = redis.pcall('GET', key)
  local foreign = ''
  if type(raw) == 'table' then
    -- WRONGTYPE: a list, a hash... put there by something else. Read as no state, and
    -- overwritten by the SET below, rather than failing every call on this counter.
    foreign = key .. ' held a ' .. redis.call('TYPE', key).ok
    raw = false
  end
  local v
  if raw and #raw <= 9 * total then
    v = { pcall(cmsgpack.unpack_limit, raw, total, 0) }
    local read, valid = false, false
    if v[1] and v[2] == -1 and (#v == total + 2 or #v == size + 2) then read, valid = pcall(integers, v) end
    if not (read and valid) then v = nil end
  end
  if not v then
    raw = false
    v = { true, -1 }
    for j = 3, total + 2 do v[j] = 0 end
  end
  for j = #v + 1, total + 2 do v[j] = 65535 end

  -- Check: whether `asked` units fit every limit of the state in v; per limit, the
  -- sub-window or window this call falls in, and the time into it (the same whatever is
  -- asked). b: the index in v before the limit's first number; e: before a sliding
  -- limit's first end.
  local expiry = nil
  local slots, fines = {}, {}
  local function check(asked)
    local admitted = true
    local b, e = 2, size + 2
    for a = FIRST, #args, 4 do
      local kind, window, param, rpu = args[a], args[a + 1], args[a + 2], args[a + 3]
      if kind == 's' then
        -- v[b + 1] is the newest sub-window s written, v[b + 2 + s % ring] its count * 256 +
        -- start (where its count reached two, in 1/256ths of the sub-window), v[e + 1 +
        -- s % ring] its end (where its last hit landed, in 1/65536ths); see
        -- crates/tollgate-core/src/algo/sliding.rs. Sub-windows older than newest - param
        -- are stale and count as empty; newest <= slot.
        local ring, sub, newest = param + 1, window / param, v[b + 1]
        local slot = floor(now / sub)
        local into = now - slot * sub
        if slot < newest then slot = newest; into = 0 end
        local fine = fraction(into, sub)
        slots[a], fines[a] = slot, fine
        local full = 0
        for s = slot - param + 1, newest do
          local x = v[b + 2 + s % ring]
          full = full + x - x % 256
        end
        full = full / 256
        local oldest, last = 0, 0
        if slot - param <= newest then
          oldest = v[b + 2 + (slot - param) % ring]
          last = min(v[e + 1 + (slot - param) % ring], 65535)
        end
        local start = oldest % 256
        -- Read as the Rust u32 count; the product below then stays under 2^48.
        local count = min((oldest - start) / 256, 4294967295)
        start = start * 256
        -- full + asked + count * inside / (last - start) <= rpu, where inside is the part of
        -- [start, last] after fine; at last <= start, all of it while fine < last.
        local room = rpu - full - asked
        if room < 0 then
          admitted = false
        elseif last <= start then
          if fine < last and count > room then admitted = false end
        elseif count * max(last - max(fine, start), 0) > room * (last - start) then
          admitted = false
        end
        b = b + param + 2
        e = e + param + 1
      elseif kind == 'f' or kind == 'c' then
        local w, count
        if kind == 'f' then
          w = floor(now / window)
        elseif now < window[2] then
          -- Named by its start. A clock more than half a window off the caller's falls
          -- outside the boundaries and counts in the nearest window.
          w = window[1]
        else
          w = window[2]
        end
        count = v[b + 2]
        if w <= v[b + 1] then w = v[b + 1] else count = 0 end
        slots[a], v[b + 2] = w, count
        if count + asked > rpu then admitted = false end
        b = b + 2
      else
        if rpu == 0 then
          admitted = false
        elseif max(v[b + 1] - now, 0) + muldiv(asked, window, rpu) > muldiv(param, window, rpu) then
          admitted = false
        end
        b = b + 1
      end
    end
    return admitted
  end

  -- The most units from need to want that fit, by the bisection of the Rust `take`
  -- (store/shared/protocol.rs), so that both find the same number; 0 if need does not fit.
  local function most(need, want)
    if check(want) then return want end
    if need == 0 or not check(need) then return 0 end
    local lo, hi = need, want
    while hi - lo > 1 do
      local mid = lo + floor((hi - lo) / 2)
      if check(mid) then lo = mid else hi = mid end
    end
    return lo
  end

  -- One step on the state in v: check, then count admitted (or charged) hits or give hits
  -- back; whether it admitted (a take keeps the units it took in `taken`). Sets expiry when
  -- it wrote: how long the key must live.
  local taken = nil
  local function step(mode, hits)
    local admitted
    if mode == 'l' then
      hits = most(extra, hits)
      taken, admitted, mode = hits, hits > 0, 'c'
    elseif mode == 'k' or mode == 'r' or mode == 'g' then
      admitted = check(0)
    else
      admitted = check(hits)
    end

    -- Write: count admitted (or charged) hits, or give hits back; the key lives until its
    -- last limit forgets them.
    if (admitted and mode == 'c') or mode == 'p' or mode == 'r' or mode == 'g' then
      local ttl = 0
      local b, e = 2, size + 2
      for a = FIRST, #args, 4 do
        local kind, window, param, rpu = args[a], args[a + 1], args[a + 2], args[a + 3]
        local expires
        if kind == 's' then
          local ring, sub, newest, slot = param + 1, window / param, v[b + 1], slots[a]
          if slot > newest then
            for s = max(newest + 1, slot - param), slot do
              v[b + 2 + s % ring] = 0
              v[e + 1 + s % ring] = 0
            end
            newest = slot
            v[b + 1] = slot
          end
          if mode == 'g' then
            local taken = floor(extra / sub)
            if taken <= slot and slot - taken <= param then
              local j = b + 2 + taken % ring
              local x = v[j]
              v[j] = x - min(hits, (x - x % 256) / 256) * 256
            end
          elseif mode ~= 'r' then
            local j = b + 2 + slot % ring
            local start = v[j] % 256
            local count = (v[j] - start) / 256
            if count < 2 and param > 1 then start = floor(fines[a] / 256) end
            -- Held at the Rust u32 count's most, which denies as the true one would.
            v[j] = min(count + hits, 4294967295) * 256 + start
            j = e + 1 + slot % ring
            v[j] = max(v[j], fines[a])
          else
            local left = hits
            for s = slot, slot - param, -1 do
              local j = b + 2 + s % ring
              local x = v[j]
              local take = min(left, (x - x % 256) / 256)
              v[j] = x - take * 256
              left = left - take
            end
          end
          expires = (newest + param + 1) * sub
          b = b + param + 2
          e = e + param + 1
        elseif kind == 'f' or kind == 'c' then
          local w = slots[a]
          v[b + 1] = w
          if mode == 'g' then
            if kind == 'f' and floor(extra / window) == w then v[b + 2] = max(v[b + 2] - hits, 0) end
          elseif mode ~= 'r' then
            v[b + 2] = min(v[b + 2] + hits, EXACT - 1)
          else
            v[b + 2] = max(v[b + 2] - hits, 0)
          end
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
          b = b + 2
        else
          if rpu > 0 then
            local span, tat = muldiv(hits, window, rpu), v[b + 1]
            -- A give-back leaves the arrival time alone (lease.rs says why).
            if mode == 'r' then
              tat = max(tat - span, now)
            elseif mode ~= 'g' then
              tat = min(max(tat, now) + span, EXACT - 1)
            end
            v[b + 1] = tat
            expires = tat
          else
            expires = now
          end
          b = b + 1
        end
        ttl = max(ttl, expires - now)
      end
      expiry = ttl
    end
    return admitted
  end

  -- A debt is charged before the call's own step, as if it had been counted when its units
  -- were admitted.
  if debt > 0 then step('p', debt) end
  local admitted = step(mode, hits)
  if expiry then
    if expiry > 0 then
      redis.call('SET', key, cmsgpack.pack(unpack(v, 3, total + 2)), 'PX', math.ceil(expiry / 1000))
    else
      redis.call('DEL', key)
    end
  end

  local flag = admitted and 1 or 0
  if taken then flag = taken elseif mode == 'g' then flag = 1 end
  return { flag, now, raw or '', foreign }
end

-- Every call in order, each on its own key: the replies in the same order.
local replies = {}
for i = 1, #KEYS do replies[i] = run(KEYS[i], ARGV[i]) end
return replies
