#!lua flags=allow-oom
-- semaphore/release: give back a holder's permits, only that holder's.
--
-- KEYS[1]  the semaphore written by semaphore/acquire.
-- ARGV[1]  id      the permit id, 32 lowercase hex digits.
-- ARGV[2]  weight  integer 1..10000, how many permits the id was granted.
--
-- Reply: {released}
--   1  all `weight` permits of the id were there and unexpired; now removed
--   0  they were gone or expired (the holder lost them: another holder may
--      have taken their place); what was left of "<id>:1".."<id>:<weight>"
--      is removed
--   error NOLOCK_WEIGHT  the id holds unexpired permits of another weight
--      (the rule of semaphore/extend); nothing was removed. A release with
--      a smaller weight would otherwise free part of a holding that its
--      holder still counts on.
--
-- Guarantees: removes only members "<id>:1".."<id>:<weight>", never another
-- holder's. The key then expires with its latest remaining permit, and is
-- deleted with its last one (with the tag member, when only that is left).
-- Declared allow-oom: it only frees memory, so it runs on a full server.
-- Before the first write the key must be a sorted set (or absent) whose
-- tag, lowest permit and highest member have nolock's form (lib/permits
-- permit_bounds), else a definite error and nothing written.
--
-- Tag: the call does not know the semaphore's size, so it checks the tag
-- member "by:m<P>" for its form only, and keeps it while permits are left:
-- a release only frees places, whatever the size.
--
-- Example: id "ab..", weight 1, unexpired: {1}; again: {0}. The same id
-- held with weight 3, released with weight 1: NOLOCK_WEIGHT, nothing removed.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits

local key = KEYS[1]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local weight = stored_int(ARGV[2], 1, 10000)
if not weight then return fail('bad weight: ' .. tostring(ARGV[2])) end

local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag = permit_bounds(key)
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end

local now = math.floor(now_us() / 1000)
local holding = permit_holding(key, id, weight, now)
if holding == 'weight' then return permit_weight_error() end
local held = 0
if holding == 'held' then held = 1 end
local members = {}
for i = 1, weight do
  members[i] = id .. ':' .. i
end

-- The set is read again only if the removal left a permit: Redis deletes
-- an emptied sorted set, and in a slot being migrated a script may not
-- touch a key its node no longer has (the call would fail after it has
-- written). A tag left alone goes with the key.
local left = redis.call('ZCARD', key)
for i = 1, weight, 200 do
  left = left - redis.call('ZREM', key, unpack(members, i, math.min(i + 199, weight)))
end
if tag and left == 1 then
  redis.call('DEL', key)
elseif left > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, math.ceil(tonumber(last[2])))
end
return {held}
