#!lua flags=allow-oom
-- fence/extend: reset a lock's TTL, only if it still holds the caller's token.
--
-- KEYS[1]  the lock written by fence/acquire.
-- ARGV[1]  holder the lock value of the grant being extended,
--                 "<fence>:<token>" as fence/acquire stored it.
-- ARGV[2]  ttl    integer milliseconds, 1 <= ttl <= 2^53-1: the new expiry,
--                 counted from now (not added to what is left).
--
-- Reply: {extended}
--   1  the lock held ARGV[1]; it now expires ttl ms from now
--   0  the lock is gone or held under another token; nothing was written
--
-- Guarantees: never extends someone else's lock, and never brings back a
-- lock that has expired (that would need a new grant and a new fence).
-- Declared allow-oom: PEXPIRE allocates nothing, and a lease holder must be
-- able to keep its lock on a full server.
--
-- Example: lock = "7:ab.." with 100 ms left: extend "7:ab..", 30000 gives {1}
-- and PTTL 30000; extend "7:cd..", 30000 gives {0}.

--@include lib/fail
--@include lib/args

local holder = ARGV[1]
if holder == nil or holder == '' then
  return fail('empty holder')
end
local ttl = arg_int(2, 1, 9007199254740991)
if ttl == nil then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end
if redis.call('GET', KEYS[1]) == holder then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1}
end
return {0}
