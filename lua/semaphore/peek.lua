#!lua flags=no-writes
-- semaphore/peek: read a semaphore without changing it.
--
-- KEYS[1]  the semaphore written by semaphore/acquire.
-- ARGV[1]  permits  optional, integer 1..10000: the reader's size. Given,
--                   the set's tag (lib/tag: "by:m<P>") must be "m<permits>".
-- ARGV[2]  "adopt"  optional, after permits: any size's tag is read.
--
-- Reply: {in_use, holders, next_expiry}
--   in_use       unexpired permits (members with expiry after now)
--   holders      distinct ids among them (weighted holders count once)
--   next_expiry  ms until the earliest unexpired permit expires; -1 if none
--   error NOLOCK_STATE  permits given, and the set is tagged with another
--                       size (without "adopt")
--
-- Read-only (flags=no-writes): runs with EVALSHA_RO, replicas accept it;
-- expired members are counted out, not removed. Every unexpired member and
-- score is checked (this is O(permits held)), and the tag, lowest permit
-- and highest member (lib/permits permit_bounds): anything not in nolock's
-- form is a definite error. The tag member (score 0) is never a permit.
-- Without permits only the tag's form is checked (config inspect reads
-- any size).
--
-- Example: 3 unexpired members "a:1", "a:2", "b:1", earliest in 250 ms:
--   {3, 2, 250}; with tag "by:m3" and permits 2: NOLOCK_STATE.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits
--@include lib/tag

local key = KEYS[1]
local ours, adopt
if #ARGV > 0 then
  if not stored_int(ARGV[1], 1, 10000) then
    return fail('bad permits: ' .. tostring(ARGV[1]))
  end
  adopt = tag_adopt(1)
  if adopt == nil then return fail('expected permits and "adopt", got ' .. #ARGV) end
  ours = 'm' .. ARGV[1]
end
local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0, 0, -1} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag = permit_bounds(key)
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end
if ours and tag and not tag_same(tag, ours, adopt) then
  return tag_refuse(key, tag, ours)
end
local now = math.floor(now_us() / 1000)
local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
local holders = 0
for i = 1, #live, 2 do
  if not permit_member(live[i]) or not stored_int(live[i + 1], 1, 9007199254740991) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
  if live[i]:sub(-2) == ':1' then holders = holders + 1 end
end
local next_expiry = -1
if live[2] then next_expiry = tonumber(live[2]) - now end
return {#live / 2, holders, next_expiry}
