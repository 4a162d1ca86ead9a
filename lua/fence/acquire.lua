-- fence/acquire: take a lock if it is free, and hand out the next fencing token.
--
-- KEYS[1]  the lock: a string "<fence>:<token>" (the grant's fence, then the
--          owner token), with a TTL.
-- KEYS[2]  the fence counter: an integer string with NO TTL, incremented once
--          per grant and never reset. Same hash tag as KEYS[1].
-- KEYS[3]  optional: the waiting flag, a string with a TTL whose presence
--          tells fence/release that someone waits (nolock sends
--          `keys::derive(resource, "waiting")` from fence::Waiters). Same hash
--          tag as KEYS[1].
-- ARGV[1]  token  non-empty string, unique per acquisition (nolock sends 128
--                 random bits as 32 hex digits).
-- ARGV[2]  ttl    integer milliseconds, 1 <= ttl <= 2^53-1: the lock's expiry.
-- ARGV[3]  wait   with KEYS[3] only: integer milliseconds, 1 <= wait <=
--                 2^53-1, the longest the caller sleeps before it tries again.
--
-- Reply: {acquired, detail}
--   acquired = 1: detail is the fence of this grant, as a decimal STRING
--                 (counters pass 2^53, where Lua numbers lose precision).
--   acquired = 0: the lock is held under another token; detail is its PTTL in
--                 milliseconds (-1 when someone left it without an expiry).
--                 Nothing was written, but for the waiting flag: with KEYS[3]
--                 it now lives at least ARGV[3] ms more (a longer TTL that
--                 another waiter set is kept).
--
-- Guarantees: the check, the increment and the SET happen in one atomic step,
-- so at most one token holds the lock at a time and every grant gets a fence
-- strictly greater than all earlier grants of this resource (as long as the
-- counter survives: see the fence module docs on persistence and failover).
-- If the lock already holds ARGV[1] (a retry of an acquire whose reply was
-- lost), the call is idempotent: the TTL is set again and the SAME fence is
-- returned, the one stored in the lock, without a new increment. A re-entry
-- never answers the counter: after fence/advance raised it past this grant,
-- the grant keeps its own (now refused) fence and is not handed the floor as
-- if it were fresh.
-- A lock value not of the form "<digits>:<token>" (written by something else,
-- or by an older nolock that stored the token alone) is a lock held by
-- someone else: it is left to its TTL.
-- All arguments and the counter are checked before the first write: a counter
-- that is not exactly a canonical decimal in [1, 2^63-1] (the only form
-- nolock writes) is an error naming the key, and INCR refuses to pass 2^63-1
-- before anything is set.
--
-- The waiting flag is how a release knows whether to wake anyone: a waiter
-- marks it in the same atomic step as the attempt that found the lock held,
-- for as long as it will sleep, so a release during that sleep sees it
-- (fence/release announces only then). Its TTL only grows here: a waiter
-- with a shorter sleep never cuts another's mark short.
--
-- Example: a free lock, counter at 41, token "ab..", ttl 30000:
--   {1, "42"} and the lock holds "42:ab.."; the same call by another token:
--   {0, 29998}; by "ab.." again: {1, "42"}. By another token with
--   KEYS[3] = "{r}:waiting", ARGV[3] = 502: {0, 29997}, and the flag lives
--   502 ms (or longer, if it already did).

--@include lib/fail

local token = ARGV[1]
if token == nil or token == '' then
  return fail('empty token')
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl % 1 ~= 0 or ttl < 1 or ttl > 9007199254740991 then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end
local wait
if KEYS[3] then
  wait = tonumber(ARGV[3])
  if not wait or wait % 1 ~= 0 or wait < 1 or wait > 9007199254740991 then
    return fail('bad wait: ' .. tostring(ARGV[3]))
  end
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
local holder
if incrementable then
  -- The next fence, as digits: exact below 2^53 through a double, above it
  -- by carrying the trailing nines (the counter is at most 2^63 - 2 here,
  -- so it is never all nines).
  local fence
  if not counter then
    fence = '1'
  elseif #counter < 16 then
    fence = string.format('%d', tonumber(counter) + 1)
  else
    local head, nines = string.match(counter, '^(.-)(9*)$')
    fence = string.sub(head, 1, -2) .. string.char(string.byte(head, -1) + 1)
      .. string.rep('0', #nines)
  end
  holder = redis.call('SET', KEYS[1], fence .. ':' .. token, 'NX', 'PX', ttl, 'GET')
  if not holder then
    -- Granted: the counter moves to the fence just stored with the lock.
    redis.call('INCR', KEYS[2])
    return {1, fence}
  end
else
  -- Refused before any write, unless the lock is held: then the answer is
  -- the one the lock gives, as when the lock is read first.
  holder = redis.call('GET', KEYS[1])
  if not holder then
    if type(counter) ~= 'string' then
      return redis.call('GET', KEYS[2]) -- raises the WRONGTYPE error
    end
    if counter == '9223372036854775807' then
      return redis.call('INCR', KEYS[2]) -- raises the overflow error, writes nothing
    end
    return fail(KEYS[2] .. ': fence counter holds a non-counter value')
  end
end

local held, owner = string.match(holder, '^(%d+):(.*)$')
if owner == token then
  -- Our own earlier grant (the SET did nothing): its fence, as stored.
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, held}
end
if wait and redis.call('PTTL', KEYS[3]) < wait then
  redis.call('SET', KEYS[3], '1', 'PX', wait)
end
return {0, redis.call('PTTL', KEYS[1])}
