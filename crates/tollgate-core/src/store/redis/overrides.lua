-- Tollgate: the runtime overrides of one key prefix, changed and read atomically in
-- Redis server time. Four keys in one Cluster slot:
--   KEYS[1]  hash: field the descriptor's id, value the override's JSON (the truth)
--   KEYS[2]  sorted set, the change log: member an id, score the version of its last
--            change (a set, a delete, a purge); only the newest LOG_KEEP are kept
--   KEYS[3]  sorted set: member an id, score the Unix second its override expires
--   KEYS[4]  hash: epoch (names this log; a new one means start over), version (of the
--            last change), trimmed (the newest version dropped from the log)
-- ARGV     op ('set', 'delete', 'log'), epoch for a log that has none yet, channel,
--          announcement, then per op:
--   set     deadline_us (0: none), id, JSON, expires_at (0: never), max
--           -> {'late'} past the deadline, nothing changed; {'full', live} when a new id
--              would pass max live overrides; {'set', previous JSON or ''}
--   delete  deadline_us, id -> {'late'}; {'deleted', previous JSON or ''}
--   log     since, most, most_bytes -> {epoch, version, trimmed, upto, complete ('1'/'0'),
--           then per change after since (at most most, and most_bytes of JSON): id,
--           JSON or '' (deleted)}
-- Every op first purges overrides expired by now (a batch at most), logging each. An
-- error is raised before anything is written.

local LOG_KEEP = 10000
local PURGE_BATCH = 1000

local set_key, log_key, expiry_key, meta_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, channel, announcement = ARGV[1], ARGV[3], ARGV[4]

local time = redis.call('TIME')
local now_s = tonumber(time[1])
local now_us = now_s * 1000000 + tonumber(time[2])

-- A whole number from the meta hash (0 when absent); anything else stops the script.
local function count(field)
  local text = redis.call('HGET', meta_key, field)
  if not text then return 0 end
  local n = tonumber(text)
  if not n or n < 0 or n ~= math.floor(n) or n >= 2 ^ 53 then
    return error({ err = 'ERR tollgate overrides: ' .. meta_key .. ' ' .. field ..
      ' is not a version: ' .. text })
  end
  return n
end

local version, trimmed = count('version'), count('trimmed')
-- The log starts with its first change: a read of none writes nothing, and answers an
-- empty epoch, whose reader takes the first epoch logged from version 0.
local epoch = redis.call('HGET', meta_key, 'epoch')

local changed = false
local function logged(id)
  if not epoch then
    epoch = ARGV[2]
    redis.call('HSET', meta_key, 'epoch', epoch)
  end
  version = version + 1
  redis.call('ZADD', log_key, version, id)
  local excess = redis.call('ZCARD', log_key) - LOG_KEEP
  if excess > 0 then
    local dropped = redis.call('ZRANGE', log_key, 0, excess - 1, 'WITHSCORES')
    local newest = tonumber(dropped[#dropped]) or version
    trimmed = math.min(math.max(trimmed, newest), version)
    redis.call('ZREMRANGEBYRANK', log_key, 0, excess - 1)
  end
  changed = true
end

local function finish()
  if changed then
    redis.call('HSET', meta_key, 'version', string.format('%.0f', version),
      'trimmed', string.format('%.0f', trimmed))
    redis.call('PUBLISH', channel, announcement)
  end
end

local function purge()
  local gone = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', now_s, 'LIMIT', 0, PURGE_BATCH)
  for _, id in ipairs(gone) do
    redis.call('ZREM', expiry_key, id)
    if redis.call('HDEL', set_key, id) == 1 then logged(id) end
  end
end

-- The stored override of id, unless expired (a purge may not have reached it yet).
local function live_of(id)
  local spec = redis.call('HGET', set_key, id)
  if not spec then return nil end
  local expires = tonumber(redis.call('ZSCORE', expiry_key, id))
  if expires and expires <= now_s then return nil end
  return spec
end

if op == 'set' or op == 'delete' then
  local deadline, id = tonumber(ARGV[5]), ARGV[6]
  if not deadline or id == nil then
    return error({ err = 'ERR tollgate overrides: a change without a deadline or an id' })
  end
  if deadline > 0 and now_us > deadline then return { 'late' } end
  purge()
  local previous = live_of(id)
  if op == 'set' then
    local spec, expires, max = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
    if not spec or not expires or not max then
      return error({ err = 'ERR tollgate overrides: a set without its JSON, expiry or max' })
    end
    if not previous then
      local live = redis.call('HLEN', set_key) - redis.call('ZCOUNT', expiry_key, '-inf', now_s)
      if live >= max then
        finish()
        return { 'full', string.format('%.0f', live) }
      end
    end
    redis.call('HSET', set_key, id, spec)
    if expires > 0 then
      redis.call('ZADD', expiry_key, expires, id)
    else
      redis.call('ZREM', expiry_key, id)
    end
    logged(id)
    finish()
    return { 'set', previous or '' }
  end
  if redis.call('HDEL', set_key, id) == 1 then
    redis.call('ZREM', expiry_key, id)
    logged(id)
  end
  finish()
  return { 'deleted', previous or '' }
end

if op == 'log' then
  local since, most, most_bytes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  if not since or not most or not most_bytes then
    return error({ err = 'ERR tollgate overrides: a log read without its bounds' })
  end
  purge()
  finish()
  local reply = { epoch or '', string.format('%.0f', version), string.format('%.0f', trimmed),
    string.format('%.0f', version), '1' }
  if most == 0 or since >= version then return reply end
  local entries = redis.call('ZRANGEBYSCORE', log_key, '(' .. string.format('%.0f', since),
    version, 'WITHSCORES', 'LIMIT', 0, most)
  local bytes = 0
  for i = 1, #entries, 2 do
    local id = entries[i]
    local spec = redis.call('HGET', set_key, id) or ''
    if bytes > 0 and bytes + #spec > most_bytes then
      reply[5] = '0'
      return reply
    end
    bytes = bytes + #spec
    reply[4] = entries[i + 1]
    reply[#reply + 1] = id
    reply[#reply + 1] = spec
  end
  if #entries / 2 == most then reply[5] = '0' end
  if reply[5] == '1' then reply[4] = string.format('%.0f', version) end
  return reply
end

return error({ err = 'ERR tollgate overrides: unknown op ' .. tostring(op) })
