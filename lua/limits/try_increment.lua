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

local function int_arg(i, min, name)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < min or v > 9007199254740991 then
    return nil, redis.error_reply('ERR nolock limits/try_increment: bad ' .. name .. ': ' .. tostring(ARGV[i]))
  end
  return v
end

local limit, err = int_arg(1, 1, 'limit')
if err then return err end
local window, err2 = int_arg(2, 1, 'window')
if err2 then return err2 end
local n, err3 = int_arg(3, 1, 'n')
if err3 then return err3 end
if n > limit then
  return redis.error_reply('ERR nolock limits/try_increment: n is above limit')
end

local stored = redis.call('GET', KEYS[1])
local count = 0
if stored then
  count = tonumber(stored)
  if count == nil or count < 0 or count ~= math.floor(count) then
    return redis.error_reply('ERR nolock limits/try_increment: counter holds a non-counter value')
  end
end

-- Compared as n > limit - count so that no intermediate passes 2^53.
local function expiry()
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl == -1 then
    redis.call('PEXPIRE', KEYS[1], window)
    pttl = window
  end
  return pttl
end

if n > limit - count then
  return {0, count, expiry()}
end

count = redis.call('INCRBY', KEYS[1], n)
return {1, count, expiry()}
