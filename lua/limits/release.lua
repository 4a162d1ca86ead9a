-- limits/release: take up to n back from a bounded counter, never below zero.
--
-- KEYS[1]  the counter written by limits/try_increment.
-- ARGV[1]  n  integer, 1 <= n <= 2^53-1: the amount to give back.
--
-- Reply: {count, released}
--   count     the counter after the call (0 when the key does not exist)
--   released  how much was actually taken off: min(n, count before)
--
-- Guarantees: the counter never goes below zero, and a missing key is not
-- created. The window (TTL) is left as it is, so releasing does not open a
-- new window. With try_increment this makes a concurrency limit: increment
-- when work starts, release when it ends; the window is the safety net that
-- frees slots of callers that crashed before releasing.
--
-- Example: counter 2, n 5: {0, 2}. Counter 7, n 3: {4, 3}.

--@include lib/fail
--@include lib/args
--@include lib/stored

local MAX = 9007199254740991

local n = arg_int(1, 1, MAX)
if not n then return fail('bad n: ' .. tostring(ARGV[1])) end

local stored = redis.call('GET', KEYS[1])
if not stored then
  return {0, 0}
end
local count = stored_int(stored, 0, MAX)
if not count then return fail('key ' .. KEYS[1] .. ' holds a non-counter value') end

local take = math.min(n, count)
if take > 0 then
  count = redis.call('DECRBY', KEYS[1], take)
end
return {count, take}
