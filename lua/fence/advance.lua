-- fence/advance: raise a resource's fence counter above a floor; never lower it.
--
-- KEYS[1]  the fence counter written by fence/acquire: an integer string with
--          no TTL.
-- ARGV[1]  floor  a decimal integer without leading zeros,
--                1 <= floor <= 2^63-2 (the counter, one above it, must stay
--                within Redis' integer limit): the highest fence the
--                protected resource has seen.
--
-- Reply: {raised, counter}
--   raised = 1: the counter was at or below ARGV[1] (or missing) and is now
--               ARGV[1] + 1.
--   raised = 0: the counter was already above ARGV[1]; nothing was written.
--   counter     the counter afterwards, as a decimal STRING (exact above 2^53).
--
-- Use: after the counter was lost (a restart without persistence, a failover
-- to a lagging replica), raise it to the highest fence the resource carries,
-- so the next grant is above every fence already used. A current holder whose
-- fence is now below the counter sees its fenced writes refused as stale,
-- and so does every holder OF the floor: after a failover handed the same
-- fence to two holders, advancing to that fence refuses both (a counter
-- left AT the floor would accept both, since a write equal to the counter
-- is the newest grant's).
--
-- Guarantees: compared exactly as digits, checked before the only write; a
-- counter that is not a canonical decimal is an error and is left untouched.
--
-- Example: counter "3": advance 10 gives {1, "11"} and the next acquire hands
-- out 12; advance 5 then gives {0, "11"}; advance 11 gives {1, "12"}.

--@include lib/fail
--@include lib/decimal

local floor = ARGV[1]
if not dec_canonical(floor, I64_MAX) or floor == I64_MAX then
  return fail('bad floor: ' .. tostring(floor))
end
local counter = redis.call('GET', KEYS[1])
if counter and not dec_canonical(counter, I64_MAX) then
  return fail(KEYS[1] .. ' holds a non-counter value')
end
if counter and dec_less(floor, counter) then
  return {0, counter}
end
redis.call('SET', KEYS[1], floor)
redis.call('INCR', KEYS[1])
return {1, redis.call('GET', KEYS[1])}
