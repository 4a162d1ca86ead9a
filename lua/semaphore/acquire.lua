-- semaphore/acquire: take `weight` permits of a semaphore of `permits`, all
-- or nothing, each expiring `ttl` ms from now on the server clock.
--
-- KEYS[1]  the semaphore: a sorted set, one member per permit held,
--          "<id>:<i>" (id = 32 lowercase hex digits, i = 1..weight) scored
--          with its expiry in server-time milliseconds since the Unix epoch.
--          The key itself expires (PEXPIREAT) with its latest member.
-- ARGV[1]  id       the holder's permit id, 32 lowercase hex digits.
-- ARGV[2]  permits  integer 1..10000, the semaphore's size.
-- ARGV[3]  weight   integer 1..permits, how many permits to take at once.
-- ARGV[4]  ttl      integer milliseconds 1..2^52: the permits' lifetime.
--
-- Reply: {1, in_use}            acquired; in_use counts this holder's permits
--        {0, retry_after, in_use} full; retry_after = ms until enough of the
--                                 current permits expire for `weight` to fit
--                                 (if none is released or extended first)
--        error NOLOCK_WEIGHT      the id holds unexpired permits of another
--                                 weight (below); nothing written
--
-- Weight (as semaphore/extend and semaphore/release decide it,
-- lib/permits permit_holding): when "<id>:1" is unexpired the id holds
-- permits, and they must be exactly "<id>:1".."<id>:<weight>", all
-- unexpired, with "<id>:<weight+1>" absent or expired; otherwise they were
-- granted with another weight and the call is refused (NOLOCK_WEIGHT, which
-- names the key, never the id).
--
-- Guarantees: expired permits are reclaimed (each one removed by its score;
-- only those whose expiry is at or before now) before counting, at every
-- call. Never more than `permits` unexpired members after an admission. A
-- holder whose id already holds unexpired permits of this weight (a retry
-- after a lost reply) gets them again with a fresh expiry, no second set.
-- Before the first write: the key must be a sorted set (or absent); its
-- lowest and highest members (which bound every score), every expired
-- member and this id's own members must have nolock's exact form, else a
-- definite error and nothing written.
--
-- Example: empty key, permits 2, weight 1, ttl 1000 at server time T:
--   {1, 1} and ZSCORE key "<id>:1" = T+1000; two more other ids: {1, 2},
--   then {0, <ms until T+1000>, 2}.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits

local MAX_EXPIRY = 9007199254740991

local key = KEYS[1]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local permits = stored_int(ARGV[2], 1, 10000)
if not permits then return fail('bad permits: ' .. tostring(ARGV[2])) end
local weight = stored_int(ARGV[3], 1, permits)
if not weight then return fail('bad weight: ' .. tostring(ARGV[3])) end
local ttl = stored_int(ARGV[4], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[4])) end

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
-- Lowest and highest members: every score lies between their two scores.
local function check_rank(rank)
  local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  if pair[1] == nil then return true, nil end
  local score = stored_int(pair[2], 1, MAX_EXPIRY)
  if not permit_member(pair[1]) or not score then return false, nil end
  return true, score
end
local ok, lowest = check_rank(0)
local ok2, highest = check_rank(-1)
if not ok or not ok2 then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end

local now = math.floor(now_us() / 1000)
local expiry = now + ttl

local expired = redis.call('ZRANGEBYSCORE', key, '-inf', now)
for _, m in ipairs(expired) do
  if not permit_member(m) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end
local in_use = redis.call('ZCARD', key) - #expired

-- This id's own unexpired permits (a retry of an acquire whose reply was lost).
local holding = permit_holding(key, id, weight, now)
if holding == 'weight' then return permit_weight_error() end
local mine = holding == 'held'

-- Writes start here. A grant adds its permits before it clears the expired
-- ones, so the set is never emptied and then touched again: Redis deletes an
-- emptied sorted set, and in a slot being migrated a script may not touch a
-- key its node no longer has (the call would fail after its first write). A
-- denial clears them first (the ranks below count unexpired members only);
-- it leaves at least one member, as in_use + weight > permits >= weight.
local function clear_expired()
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  end
end
local function add_mine()
  local args = {}
  for i = 1, weight do
    args[#args + 1] = expiry
    args[#args + 1] = id .. ':' .. i
    if #args >= 200 or i == weight then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  local latest = expiry
  if highest and highest > latest then latest = highest end
  redis.call('PEXPIREAT', key, latest)
end

if mine then
  add_mine()
  clear_expired()
  return {1, in_use}
end
if in_use + weight <= permits then
  add_mine()
  clear_expired()
  return {1, in_use + weight}
end
clear_expired()
-- Full: the permit at this rank (0-based, among the unexpired) is the one
-- whose expiry makes room for `weight`.
-- The expired members are gone by now, so ranks count unexpired ones only.
local rank = in_use + weight - permits - 1
local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
local retry_after = math.ceil(tonumber(pair[2]) - now)
if #expired > 0 and redis.call('EXISTS', key) == 1 and highest then
  redis.call('PEXPIREAT', key, highest)
end
return {0, retry_after, in_use}
