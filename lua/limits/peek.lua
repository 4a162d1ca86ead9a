#!lua flags=no-writes
-- limits/peek: read a bounded counter without changing it.
--
-- KEYS[1]  the counter written by limits/try_increment.
--
-- Reply: {count, pttl}
--   count  the counter (0 when the key does not exist)
--   pttl   milliseconds until the window resets; -2 when there is no counter
--
-- Read-only (flags=no-writes), so it runs with EVALSHA_RO and replicas accept it.

--@include lib/fail
--@include lib/stored

local stored = redis.call('GET', KEYS[1])
local count = 0
if stored then
  count = stored_int(stored, 0, 9007199254740991)
  if not count then return fail('key ' .. KEYS[1] .. ' holds a non-counter value') end
end
return {count, redis.call('PTTL', KEYS[1])}
