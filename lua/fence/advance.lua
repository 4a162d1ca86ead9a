-- fence/advance: raise a resource's fence counter above a floor; never lower
-- it, and (unless forced) never under a live lock.
--
-- KEYS[1]  the lock written by fence/acquire ("<fence>:<token>" with a TTL).
--          Only its existence and PTTL are read; anything at this key, of
--          any type, counts as a held lock and is left alone.
-- KEYS[2]  the fence counter written by fence/acquire: an integer string
--          with no TTL. Same hash tag as KEYS[1].
-- ARGV[1]  floor  a decimal integer without leading zeros,
--                1 <= floor <= 2^63-2 (the counter, one above it, must stay
--                within Redis' integer limit): the highest fence the
--                protected resource has seen.
-- ARGV[2]  mode   "free": raise only while no lock is held;
--                 "force": raise whether or not a lock is held.
--
-- Reply: {outcome, counter, pttl}
--   outcome = 1: the counter was at or below ARGV[1] (or missing) and is now
--                ARGV[1] + 1.
--   outcome = 0: the counter was already above ARGV[1]; nothing was written
--                (in both modes, held lock or not).
--   outcome = 2: mode "free" only: the counter is at or below ARGV[1] and a
--                lock is held; nothing was written.
--   counter      the counter afterwards, as a decimal STRING (exact above
--                2^53; "0" when it does not exist).
--   pttl         outcome 2: the lock's PTTL in milliseconds (-1 when it has
--                no expiry); otherwise 0.
--
-- Use: after the counter was lost (a restart without persistence, a failover
-- to a lagging replica), raise it to the highest fence the resource carries,
-- so the next grant is above every fence already used. In a fleet, several
-- processes run this at startup: mode "free" never raises the counter under
-- a live holder, whose writes through fence/write would otherwise turn
-- stale. A holder whose lock has expired (paused, or cut off) is not a live
-- holder: its fence is at most the counter, and raising the counter refuses
-- its writes, as it should once its lock is gone. Mode "force" is the
-- recovery step: every holder of a fence at or below the floor, live or
-- not, is refused, including two holders a failover gave the same fence
-- (a counter left AT the floor would accept both, since a write equal to
-- the counter is the newest grant's).
--
-- Guarantees: compared exactly as digits; the counter is checked before the
-- lock is read and before the only write; a counter that is not a canonical
-- decimal is an error and is left untouched. The check of the lock and the
-- write are one atomic step: no grant can slip in between.
--
-- Example: counter "3", no lock: advance 10 "free" gives {1, "11", 0} and
-- the next acquire hands out 12; advance 5 then gives {0, "11", 0}. With
-- that grant (12) held: advance 12 "free" gives {2, "12", 29998}; advance
-- 12 "force" gives {1, "13", 0}.

--@include lib/fail
--@include lib/decimal

local floor = ARGV[1]
if not dec_canonical(floor, I64_MAX) or floor == I64_MAX then
  return fail('bad floor: ' .. tostring(floor))
end
local mode = ARGV[2]
if mode ~= 'free' and mode ~= 'force' then
  return fail('bad mode: ' .. tostring(mode))
end
local counter = redis.call('GET', KEYS[2])
if counter and not dec_canonical(counter, I64_MAX) then
  return fail(KEYS[2] .. ' holds a non-counter value')
end
if counter and dec_less(floor, counter) then
  return {0, counter, 0}
end
if mode == 'free' then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl ~= -2 then
    return {2, counter or '0', pttl}
  end
end
redis.call('SET', KEYS[2], floor)
redis.call('INCR', KEYS[2])
return {1, redis.call('GET', KEYS[2]), 0}
