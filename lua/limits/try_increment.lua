-- limits/try_increment: add n to a bounded counter, only if it stays within limit.
--
-- KEYS[1]  the counter: an integer string whose TTL is the current window.
-- ARGV[1]  limit   integer, 1 <= limit <= 2^53-1: the most the counter may hold.
-- ARGV[2]  window  integer milliseconds, >= 1: set as the key's expiry when the
--                  increment creates the counter, and whenever the counter is
--                  found without a TTL (written by something else), even on a
--                  denial: a full counter without expiry would deny forever.
-- ARGV[3]  n       integer, 1 <= n <= limit: the amount to add, all or nothing.
--
-- Reply: {admitted, count, pttl}
--   admitted  1 when n was added; 0 when count + n would pass limit (then the
--             count is left as it was: a denial never consumes)
--   count     the counter after the call
--   pttl      milliseconds until the counter expires (the window resets);
--             -2 when there is no counter (nothing was ever admitted)
--
-- Guarantees: the read, the decision and the write happen in one atomic step,
-- so any number of concurrent callers never push the counter past limit. All
-- arguments and the stored value are checked before the first write.
--
-- Example: limit 3, window 60000, n 1, on a missing key:
--   {1, 1, 60000}  {1, 2, 59998}  {1, 3, 59997}  {0, 3, 59996} ... until expiry.

--@include lib/fail

local MAX = 9007199254740991

-- The checks of lib/args and lib/stored, written in place: a helper costs
-- a closure and a call on every increment, on the hottest script there is.
local limit, window, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not limit or limit % 1 ~= 0 or limit < 1 or limit > MAX then
  return fail('bad limit: ' .. tostring(ARGV[1]))
end
if not window or window % 1 ~= 0 or window < 1 or window > MAX then
  return fail('bad window: ' .. tostring(ARGV[2]))
end
if not n or n % 1 ~= 0 or n < 1 or n > MAX then return fail('bad n: ' .. tostring(ARGV[3])) end
if n > limit then return fail('n is above limit') end

local stored = redis.call('GET', KEYS[1])
if not stored then
  -- A new window: one write creates the counter with its expiry.
  redis.call('SET', KEYS[1], n, 'PX', window)
  return {1, n, window}
end
-- Only a canonical integer in [0, 2^53 - 1], as INCRBY writes it.
local count = #stored <= 16 and (stored == '0' or string.find(stored, '^[1-9]%d*$')) and tonumber(stored)
if not count or count > MAX then
  return fail('key ' .. KEYS[1] .. ' holds a non-counter value')
end

-- A counter found without an expiry (written by something else) gets one,
-- even on a denial: a full counter without expiry would deny forever.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -1 then
  redis.call('PEXPIRE', KEYS[1], window)
  pttl = window
end

-- Compared as n > limit - count so that no intermediate passes 2^53.
if n > limit - count then
  return {0, count, pttl}
end
return {1, redis.call('INCRBY', KEYS[1], n), pttl}
