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

local token = ARGV[1]
if token == nil or token == '' then
  return fail('empty token')
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl % 1 ~= 0 or ttl < 1 or ttl > 9007199254740991 then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end

-- The counter is read first, so that one SET ... NX GET both takes a free
-- lock and tells who holds a taken one: three commands for a grant, where
-- reading the lock first would take five.
-- (pcall: a counter of another type is answered for below, as the lock
-- decides.)
local counter = redis.pcall('GET', KEYS[2])
-- Incrementable: a canonical decimal in [1, 2^63 - 2] (lib/decimal's
-- dec_canonical, below I64_MAX; written in place, as a helper costs a
-- closure per call). A 19-digit counter is compared in two exact halves.
local incrementable = not counter or type(counter) == 'string' and #counter <= 19
  and string.find(counter, '^[1-9]%d*$') ~= nil
if incrementable and counter and #counter == 19 then
  local high = tonumber(string.sub(counter, 1, 10))
  incrementable = high < 9223372036
    or high == 9223372036 and tonumber(string.sub(counter, 11)) < 854775807
end
if not incrementable then
  -- Refused before any write, unless the lock is held: then the answer is
  -- the one the lock gives, as when the lock is read first.
  local holder = redis.call('GET', KEYS[1])
  if holder and holder ~= token then return {0, redis.call('PTTL', KEYS[1])} end
  if type(counter) ~= 'string' then
    return redis.call('GET', KEYS[2]) -- raises the WRONGTYPE error
  end
  if holder then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, counter}
  end
  if counter == '9223372036854775807' then
    return redis.call('INCR', KEYS[2]) -- raises the overflow error, writes nothing
  end
  return fail(KEYS[2] .. ': fence counter holds a non-counter value')
end

local holder = redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl, 'GET')
if holder == token then
  -- Our own earlier grant (the SET did nothing): the counter has not moved
  -- since (only a grant or fence/advance moves it).
  if not counter then
    return fail('lock held without a fence counter')
  end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, counter}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end

-- Granted. INCR's reply arrives in Lua as a double: exact below 2^53, and
-- printed exactly by tostring (%.14g) below 10^14; past that the digits
-- are read back.
local fence = redis.call('INCR', KEYS[2])
if fence < 100000000000000 then return {1, tostring(fence)} end
return {1, redis.call('GET', KEYS[2])}
