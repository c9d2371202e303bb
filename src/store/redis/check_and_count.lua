-- Tollgate: check every limit of one counter and count the hits only if all admit,
-- atomically, in Redis server time (microseconds).
--
-- KEYS[1]  the counter: one hash; fields "<limit>:<name>" per limit
-- ARGV     mode ('c' consume, 'k' check, 'r' refund), hits, number of limits, then per
--          limit: kind ('s' sliding, 'f' fixed, 'g' gcra), window_us, precision or burst,
--          requests_per_unit
-- Returns  {admitted (1/0), now_us, the hash as it was before this call}; the caller
--          recomputes the decision from that state with the same algorithm.

local key = KEYS[1]
local mode, hits, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local raw = redis.call('HGETALL', key)
local f = {}
for i = 1, #raw, 2 do f[raw[i]] = tonumber(raw[i + 1]) end
local function get(name) return f[name] or 0 end

local asked = hits
if mode == 'k' then asked = 1 elseif mode == 'r' then asked = 0 end

-- Evaluate every limit on the state as read.
local admitted = true
local limits = {}
for i = 0, n - 1 do
  local a = 4 + i * 4
  local l = { kind = ARGV[a], window = tonumber(ARGV[a + 1]), param = tonumber(ARGV[a + 2]),
              rpu = tonumber(ARGV[a + 3]), p = i .. ':' }
  limits[#limits + 1] = l
  if l.kind == 's' then
    l.sub = l.window / l.param
    l.slot = math.floor(now / l.sub)
    local into = now - l.slot * l.sub
    l.newest = get(l.p .. 'n')
    if l.slot < l.newest then l.slot = l.newest; into = 0 end
    local function count(s)
      if s <= l.newest and l.newest - s <= l.param then return get(l.p .. (s % (l.param + 1))) end
      return 0
    end
    local full = 0
    for s = l.slot - l.param + 1, l.slot do full = full + count(s) end
    local used = full * l.sub + count(l.slot - l.param) * (l.sub - into)
    if used + asked * l.sub > l.rpu * l.sub then admitted = false end
  elseif l.kind == 'f' then
    l.w = math.floor(now / l.window)
    l.stored = get(l.p .. 'w')
    local c = 0
    if l.w <= l.stored then c = get(l.p .. 'c'); l.w = l.stored end
    l.count = c
    if c + asked > l.rpu then admitted = false end
  else
    l.tat = get(l.p .. 't')
    if l.rpu == 0 then
      admitted = false
    else
      l.t = l.window / l.rpu
      if math.max(l.tat - now, 0) + asked * l.t > l.param * l.t then admitted = false end
    end
  end
end

-- Write: count admitted hits, or give hits back.
local ttl = 0
if (admitted and mode == 'c') or mode == 'r' then
  for _, l in ipairs(limits) do
    local expires
    if l.kind == 's' then
      local ring = l.param + 1
      if l.slot > l.newest then
        for s = math.max(l.newest + 1, l.slot - l.param), l.slot do
          redis.call('HDEL', key, l.p .. (s % ring))
        end
        redis.call('HSET', key, l.p .. 'n', l.slot)
        l.newest = l.slot
      end
      if mode == 'c' then
        redis.call('HINCRBY', key, l.p .. (l.slot % ring), hits)
      else
        local left = hits
        for s = l.slot, l.slot - l.param, -1 do
          local field = l.p .. (s % ring)
          local c = tonumber(redis.call('HGET', key, field)) or 0
          local take = math.min(left, c)
          if take > 0 then redis.call('HINCRBY', key, field, -take) end
          left = left - take
        end
      end
      expires = (l.newest + l.param + 1) * l.sub
    elseif l.kind == 'f' then
      local c = l.count
      if mode == 'c' then c = c + hits else c = math.max(c - hits, 0) end
      redis.call('HSET', key, l.p .. 'w', l.w, l.p .. 'c', c)
      expires = (l.w + 1) * l.window
    elseif l.rpu > 0 then
      local tat
      if mode == 'c' then
        tat = math.max(l.tat, now) + hits * l.t
      else
        tat = math.max(l.tat - hits * l.t, now)
      end
      tat = math.ceil(tat)
      redis.call('HSET', key, l.p .. 't', string.format('%.0f', tat))
      expires = tat
    else
      expires = now
    end
    ttl = math.max(ttl, expires - now)
  end
  redis.call('PEXPIRE', key, math.max(math.ceil(ttl / 1000), 1))
end

return { admitted and 1 or 0, now, raw }
