-- fence/acquire: take a lock if it is free, and hand out the next fencing token.
--
-- KEYS[1]  the lock: a string holding the owner token, with a TTL.
-- KEYS[2]  the fence counter: an integer string with NO TTL, incremented once
--          per grant and never reset. Same hash tag as KEYS[1].
-- ARGV[1]  token  non-empty string, unique per acquisition (nolock sends 128
--                 random bits as 32 hex digits).
-- ARGV[2]  ttl    integer milliseconds, 1 <= ttl <= 2^53-1: the lock's expiry.
--
-- Reply: {acquired, detail}
--   acquired = 1: detail is the fence of this grant, as a decimal STRING
--                 (counters pass 2^53, where Lua numbers lose precision).
--   acquired = 0: the lock is held under another token; detail is its PTTL in
--                 milliseconds (-1 when someone left it without an expiry).
--                 Nothing was written.
--
-- Guarantees: the check, the increment and the SET happen in one atomic step,
-- so at most one token holds the lock at a time and every grant gets a fence
-- strictly greater than all earlier grants of this resource (as long as the
-- counter survives: see the fence module docs on persistence and failover).
-- If the lock already holds ARGV[1] (a retry of an acquire whose reply was
-- lost), the call is idempotent: the TTL is set again and the same fence is
-- returned, without a new increment.
-- All arguments and the counter are checked before the first write: a counter
-- that is not exactly a canonical decimal in [1, 2^63-1] (the only form
-- nolock writes) is an error naming the key, and INCR refuses to pass 2^63-1
-- before anything is set.
--
-- Example: a free lock, counter at 41, token "ab..", ttl 30000:
--   {1, "42"}; the same call by another token: {0, 29998}.

--@include lib/fail
--@include lib/args
--@include lib/decimal

local token = ARGV[1]
if token == nil or token == '' then
  return fail('empty token')
end
local ttl = arg_int(2, 1, 9007199254740991)
if ttl == nil then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end

local holder = redis.call('GET', KEYS[1])
if holder == token then
  -- Our own earlier grant: the counter has not moved since (only a grant or
  -- fence/advance moves it).
  local fence = redis.call('GET', KEYS[2])
  if not fence then
    return fail('lock held without a fence counter')
  end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, fence}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end

local counter = redis.call('GET', KEYS[2])
if counter and not dec_canonical(counter, I64_MAX) then
  return fail(KEYS[2] .. ': fence counter holds a non-counter value')
end
redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ttl)
-- INCR's reply would arrive in Lua as a double; GET returns the exact digits.
return {1, redis.call('GET', KEYS[2])}
