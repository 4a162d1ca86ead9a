#!lua flags=allow-oom
-- semaphore/extend: set a holder's permits to expire `ttl` ms from now,
-- only if that holder still has all of them unexpired.
--
-- KEYS[1]  the semaphore written by semaphore/acquire.
-- ARGV[1]  id      the permit id, 32 lowercase hex digits.
-- ARGV[2]  weight  integer 1..10000, how many permits the id was granted.
-- ARGV[3]  ttl     integer milliseconds 1..2^52, counted from now (not added
--                  to what is left).
--
-- Reply: {extended}
--   1  the id held all `weight` permits unexpired; they now expire at
--      now + ttl, and the key no earlier than that
--   0  some were gone or expired; nothing was written (an expired permit is
--      never brought back: its place may already be someone else's)
--
-- Guarantees: touches only this id's members. Declared allow-oom: updating
-- scores and the key's expiry allocates nothing, and a holder must keep its
-- permit on a full server. Before the first write the key must be a sorted
-- set (or absent) whose lowest and highest members have nolock's form, else
-- a definite error and nothing written.
--
-- Example: id "ab.." with 100 ms left: extend 1000 gives {1}, ZSCORE = now+1000.

local function fail(msg)
  return redis.error_reply('ERR nolock semaphore/extend: ' .. msg)
end
local function canonical(raw, min, max)
  if type(raw) ~= 'string' or not raw:match('^%-?[1-9]%d*$') and raw ~= '0' then return nil end
  local n = tonumber(raw)
  if n == nil or n < min or n > max or #raw > 17 then return nil end
  return n
end

local key = KEYS[1]
local id = ARGV[1]
if type(id) ~= 'string' or #id ~= 32 or not id:match('^[0-9a-f]+$') then
  return fail('bad permit id')
end
local weight = canonical(ARGV[2], 1, 10000)
if not weight then return fail('bad weight: ' .. tostring(ARGV[2])) end
local ttl = canonical(ARGV[3], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[3])) end

local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local function member_ok(m)
  local hex, i = string.match(m, '^([0-9a-f]+):([1-9]%d*)$')
  return hex ~= nil and #hex == 32 and #i <= 5 and tonumber(i) <= 10000
end
local highest
for _, rank in ipairs({0, -1}) do
  local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  highest = canonical(pair[2], 1, 9007199254740991)
  if not member_ok(pair[1]) or not highest then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, weight do
  local s = redis.call('ZSCORE', key, id .. ':' .. i)
  if not s or tonumber(s) <= now then return {0} end
end

local expiry = now + ttl
local args = {}
for i = 1, weight do
  args[#args + 1] = expiry
  args[#args + 1] = id .. ':' .. i
  if #args >= 200 or i == weight then
    redis.call('ZADD', key, 'XX', unpack(args))
    args = {}
  end
end
-- The key lives until its latest member expires: ours, if it is now the
-- latest, else the highest score read above (ours may have been it, but a
-- later expiry than needed only keeps an idle key a little longer).
if highest < expiry then highest = expiry end
redis.call('PEXPIREAT', key, highest)
return {1}
