-- Tollgate: the slots of one in-flight counter, atomically, in Redis server time
-- (microseconds). The layout is a hash: field, when a group of slots frees itself (µs,
-- as decimal text); value, how many slots. Slots past their time are dropped (and
-- counted) here; the key expires an expire_after after its last slot.
--
-- KEYS[1]  the counter
-- ARGV     mode ('a' acquire n slots if all fit under max; 'r' release n slots, the
--          oldest first; 'k' check), n, max, expire_after_us, deadline_us (0: none),
--          debt (slots an instance admitted without Redis: taken first, even past max;
--          absent: none)
-- Returns  {admitted (1/0; -1 if Redis ran this after the deadline and changed nothing,
--           the debt included), now_us, slots this call found past their time and
--           dropped, then per group of live slots before this call and its debt:
--           frees_at_us, count}

local key = KEYS[1]
local mode = ARGV[1]
local n, max, expire, deadline, debt =
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6] or '0')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
if deadline > 0 and now > deadline then return { -1, now } end

if redis.call('TYPE', key).ok ~= 'hash' then redis.call('DEL', key) end
local flat = redis.call('HGETALL', key)
local reply, live, held = { 1, now, 0 }, {}, 0
for i = 1, #flat, 2 do
  local frees, count = tonumber(flat[i]), tonumber(flat[i + 1])
  if frees <= now then
    redis.call('HDEL', key, flat[i])
    reply[3] = reply[3] + count
  else
    held = held + count
    live[#live + 1] = { frees, count, flat[i] }
    reply[#reply + 1] = frees
    reply[#reply + 1] = count
  end
end

if debt > 0 then
  -- Slots admitted without Redis hold theirs from now on, whatever is held.
  local field = string.format('%.0f', now + expire)
  redis.call('HINCRBY', key, field, debt)
  held = held + debt
  local group = nil
  for _, g in ipairs(live) do
    if g[3] == field then group = g end
  end
  if group then
    group[2] = group[2] + debt
  else
    live[#live + 1] = { now + expire, debt, field }
  end
  redis.call('PEXPIRE', key, 2 * math.ceil(expire / 1000) + 1)
end

if mode == 'a' then
  if held + n > max then
    reply[1] = 0
  elseif n > 0 then
    redis.call('HINCRBY', key, string.format('%.0f', now + expire), n)
    -- The newest slots free themselves last; the key outlives them by expire_after, so
    -- that a call then finds the slots never released and counts them as expired.
    redis.call('PEXPIRE', key, 2 * math.ceil(expire / 1000) + 1)
  end
elseif mode == 'r' then
  table.sort(live, function(a, b) return a[1] < b[1] end)
  local left = n
  for _, group in ipairs(live) do
    if left <= 0 then break end
    local released = math.min(left, group[2])
    left = left - released
    if released == group[2] then
      redis.call('HDEL', key, group[3])
    else
      redis.call('HINCRBY', key, group[3], -released)
    end
  end
end
return reply
