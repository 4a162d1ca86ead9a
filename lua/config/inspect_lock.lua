#!lua flags=no-writes
-- config/inspect_lock: who holds a lock and where its fence counter is, in
-- one atomic read, without the holder's owner token (a secret).
--
-- KEYS[1]  the lock written by fence/acquire: "<fence>:<token>" with a TTL.
-- KEYS[2]  its fence counter: a canonical decimal, no TTL. Same hash tag.
--
-- Reply: {held, fence, ttl, counter}
--   held     1 when the lock is held, 0 when free
--   fence    the holder's fence, a decimal STRING ("0" when free or when the
--            lock holds a value nolock did not write)
--   ttl      ms until the lock expires; -1 when held without an expiry
--            (not nolock's), -2 when free
--   counter  the highest fence granted so far, a decimal STRING ("0" when
--            no grant was ever made)
--
-- Read-only (flags=no-writes): runs with EVALSHA_RO. A counter that is not
-- nolock's is a definite error naming the key.
--
-- Example: granted fence 42, held for 9 s more: {1, "42", 9000, "42"}.

--@include lib/fail
--@include lib/decimal

local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' then
  return fail(KEYS[1] .. ' is not a lock (not a string)')
end
local counter = redis.pcall('GET', KEYS[2])
if type(counter) == 'table' or (counter and not dec_canonical(counter, I64_MAX)) then
  return fail(KEYS[2] .. ': fence counter holds a non-counter value')
end
if not holder then
  return {0, '0', -2, counter or '0'}
end
local fence = string.match(holder, '^(%d+):') or '0'
return {1, fence, redis.call('PTTL', KEYS[1]), counter or '0'}
