#!lua flags=no-writes
-- semaphore/peek: read a semaphore without changing it.
--
-- KEYS[1]  the semaphore written by semaphore/acquire.
--
-- Reply: {in_use, holders, next_expiry}
--   in_use       unexpired permits (members with expiry after now)
--   holders      distinct ids among them (weighted holders count once)
--   next_expiry  ms until the earliest unexpired permit expires; -1 if none
--
-- Read-only (flags=no-writes): runs with EVALSHA_RO, replicas accept it;
-- expired members are counted out, not removed. Every unexpired member and
-- score is checked (this is O(permits held)): anything not in nolock's form
-- is a definite error.
--
-- Example: 3 unexpired members "a:1", "a:2", "b:1", earliest in 250 ms:
--   {3, 2, 250}.

local function fail(msg)
  return redis.error_reply('ERR nolock semaphore/peek: ' .. msg)
end
local function canonical(raw, min, max)
  if type(raw) ~= 'string' or not raw:match('^%-?[1-9]%d*$') and raw ~= '0' then return nil end
  local n = tonumber(raw)
  if n == nil or n < min or n > max or #raw > 17 then return nil end
  return n
end

local key = KEYS[1]
local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0, 0, -1} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
local holders = 0
for i = 1, #live, 2 do
  local hex, n = string.match(live[i], '^([0-9a-f]+):([1-9]%d*)$')
  if hex == nil or #hex ~= 32 or #n > 5 or tonumber(n) > 10000
     or not canonical(live[i + 1], 1, 9007199254740991) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
  if n == '1' then holders = holders + 1 end
end
local next_expiry = -1
if live[2] then next_expiry = tonumber(live[2]) - now end
return {#live / 2, holders, next_expiry}
