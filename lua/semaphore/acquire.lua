-- semaphore/acquire: take `weight` permits of a semaphore of `permits`, all
-- or nothing, each expiring `ttl` ms from now on the server clock.
--
-- KEYS[1]  the semaphore: a sorted set, one member per permit held,
--          "<id>:<i>" (id = 32 lowercase hex digits, i = 1..weight) scored
--          with its expiry in server-time milliseconds since the Unix epoch,
--          and the tag member "by:m<permits>" (lib/tag) scored 0, below
--          every permit: the size of the semaphore that granted last. The
--          key itself expires (PEXPIREAT) with its latest permit; the tag
--          is never a permit (never counted, swept or ranked).
-- ARGV[1]  id       the holder's permit id, 32 lowercase hex digits.
-- ARGV[2]  permits  integer 1..10000, the semaphore's size.
-- ARGV[3]  weight   integer 1..permits, how many permits to take at once.
-- ARGV[4]  ttl      integer milliseconds 1..2^52: the permits' lifetime.
-- ARGV[5]  "adopt"  optional: read a semaphore of another size as it is,
--                   and retag it "m<permits>" when this call grants.
--
-- Reply: {1, in_use}            acquired; in_use counts this holder's permits
--        {0, retry_after, in_use} full; retry_after = ms until enough of the
--                                 current permits expire for `weight` to fit
--                                 (if none is released or extended first)
--        error NOLOCK_WEIGHT      the id holds unexpired permits of another
--                                 weight (below); nothing written
--        error NOLOCK_STATE       the set is tagged with another size
--                                 ("by:m3" for a call of permits 1) and the
--                                 call does not adopt; nothing written
--
-- Weight (as semaphore/extend and semaphore/release decide it,
-- lib/permits permit_holding): when "<id>:1" is unexpired the id holds
-- permits, and they must be exactly "<id>:1".."<id>:<weight>", all
-- unexpired, with "<id>:<weight+1>" absent or expired; otherwise they were
-- granted with another weight and the call is refused (NOLOCK_WEIGHT, which
-- names the key, never the id).
--
-- Tag: a grant writes "by:m<permits>" (replacing another size's tag when
-- adopting); a set without one (written before tags) is read as before and
-- tagged at its next grant. A denial leaves the tag as it is.
--
-- Guarantees: expired permits are reclaimed (each one removed by its score;
-- only those whose expiry is at or before now) before counting, at every
-- call. Never more than `permits` unexpired permits after an admission. A
-- holder whose id already holds unexpired permits of this weight (a retry
-- after a lost reply) gets them again with a fresh expiry, no second set.
-- Before the first write: the key must be a sorted set (or absent); its tag,
-- lowest permit and highest member (which bound every score; lib/permits
-- permit_bounds), every expired member and this id's own members must have
-- nolock's exact form, else a definite error and nothing written.
--
-- Example: empty key, permits 2, weight 1, ttl 1000 at server time T:
--   {1, 1}, ZSCORE key "<id>:1" = T+1000 and ZSCORE key "by:m2" = 0; two
--   more other ids: {1, 2}, then {0, <ms until T+1000>, 2}. A call of
--   permits 1 then: NOLOCK_STATE (m2, not m1); with "adopt": read as it is.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits
--@include lib/tag

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
local adopt = tag_adopt(4)
if adopt == nil then return fail('expected 4 arguments and "adopt", got ' .. #ARGV) end
local ours = 'm' .. ARGV[2]

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag, highest = true, nil, nil
if kind == 'zset' then ok, tag, highest = permit_bounds(key) end
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end
if tag and not tag_same(tag, ours, adopt) then return tag_refuse(key, tag, ours) end
-- The tag member is a member but not a permit.
local tagged = 0
if tag then tagged = 1 end

local now = math.floor(now_us() / 1000)
local expiry = now + ttl

-- From 1: the tag's score, 0, is no expiry.
local expired = redis.call('ZRANGEBYSCORE', key, 1, now)
for _, m in ipairs(expired) do
  if not permit_member(m) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end
local in_use = redis.call('ZCARD', key) - #expired - tagged

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
    redis.call('ZREMRANGEBYSCORE', key, 1, now)
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
  if tag ~= ours then
    redis.call('ZADD', key, 0, 'by:' .. ours)
    if tag then redis.call('ZREM', key, 'by:' .. tag) end
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
-- The expired members are gone by now, so ranks count unexpired ones only,
-- after the tag (rank 0 when there is one).
local rank = in_use + weight - permits - 1 + tagged
local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
local retry_after = math.ceil(tonumber(pair[2]) - now)
if #expired > 0 and redis.call('EXISTS', key) == 1 and highest then
  redis.call('PEXPIREAT', key, highest)
end
return {0, retry_after, in_use}
