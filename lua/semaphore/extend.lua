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
--   0  they were gone or expired; nothing was written (an expired permit is
--      never brought back: its place may already be someone else's)
--   error NOLOCK_WEIGHT  the id holds unexpired permits of another weight:
--      "<id>:1" is unexpired but "<id>:1".."<id>:<weight>" are not all
--      unexpired, or "<id>:<weight+1>" is (the rule of semaphore/acquire,
--      lib/permits permit_holding); nothing was written. A permit restored
--      with a smaller weight would otherwise keep only part of a holding
--      alive, and the rest would be reclaimed and granted again.
--
-- Guarantees: touches only this id's members. Declared allow-oom: updating
-- scores and the key's expiry allocates nothing, and a holder must keep its
-- permit on a full server. Before the first write the key must be a sorted
-- set (or absent) whose tag, lowest permit and highest member have
-- nolock's form (lib/permits permit_bounds), else a definite error and
-- nothing written.
--
-- Tag: the call does not know the semaphore's size, so it checks the tag
-- member "by:m<P>" for its form only, and leaves it as it is: an extension
-- changes no count, and only an acquire (which compares the tag) admits.
--
-- Example: id "ab.." with 100 ms left: extend 1000 gives {1}, ZSCORE = now+1000;
-- the same id held with weight 3, extended with weight 1: NOLOCK_WEIGHT.

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
local ttl = stored_int(ARGV[3], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[3])) end

local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, _, highest = permit_bounds(key)
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end

local now = math.floor(now_us() / 1000)
local holding = permit_holding(key, id, weight, now)
if holding == 'weight' then return permit_weight_error() end
if holding == 'none' then return {0} end

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
-- The key lives until its latest permit expires: ours, if it is now the
-- latest, else the highest score read above (ours may have been it, but a
-- later expiry than needed only keeps an idle key a little longer).
if highest < expiry then highest = expiry end
redis.call('PEXPIREAT', key, highest)
return {1}
