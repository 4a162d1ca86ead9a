-- rate/token_bucket/check: take `cost` tokens from one or more token buckets, all or nothing.
--
-- A bucket holds up to `capacity` tokens and gains one every T microseconds.
-- Its state is the whole tokens in it and the instant up to which refill
-- has been credited; the part of an interval not yet worth a whole token is
-- kept by not moving that instant past it, so no refill time is ever lost
-- or counted twice.
--
-- KEYS[i]     bucket i: a hash {tokens, at}
--               tokens  integer, 0 <= tokens <= capacity
--               at      integer microseconds since the Unix epoch (server
--                       clock): refill is credited up to this instant
--             Missing means full. It expires (PEXPIREAT) when the bucket is
--             full again, rounded up to the millisecond.
-- ARGV[1]     cost      integer, 1 <= cost <= every capacity.
-- ARGV[2i]    interval  T of bucket i, integer microseconds >= 1 per token:
--                       period / rate (rounded up by the caller).
-- ARGV[2i+1]  capacity  C of bucket i, integer >= 1, with C x T <= 2^51.
--
-- Decision, with now = TIME in microseconds, for each bucket:
--   add    = floor((now - at) / T)
--   tokens = min(C, tokens + add); at = now when full, else at + add x T
--   fits   = cost <= tokens
-- When every bucket fits, each stores {tokens - cost, at}; otherwise nothing
-- is written (a denied call consumes nothing, on any bucket).
--
-- Reply: {admitted, now, then per bucket: fits, remaining, retry_after, reset_after}
--   admitted     1 when every bucket fitted and was charged; else 0
--   now          the server time of the decision, microseconds since the epoch
--   fits         1 when this bucket on its own had `cost` tokens
--   remaining    tokens left after this call
--   retry_after  milliseconds (rounded up) until the bucket holds `cost`
--                tokens if nothing else arrives; -1 when it fits now
--   reset_after  milliseconds (rounded up) until the bucket is full again
--
-- Guarantees: every bucket is read and decided before the first write. The
-- decisions are exactly those of rate/gcra/check for the same T and burst = C
-- (TAT = at + (C - tokens) x T); only the stored form differs.
--
-- Example: capacity 10, 10 per second (T = 100000), on a missing key at now = N:
-- {1, N, 1, 9, -1, 100}, state {tokens = 9, at = N}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/bucket

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end
local interval, capacity = {}, {}
for i = 1, n do
  local t, c = arg_int(2 * i, 1, MAX_FILL), arg_int(2 * i + 1, 1, MAX)
  if not t or not c or c * t > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  if cost > c then return fail('cost is above the capacity of key ' .. i) end
  interval[i], capacity[i] = t, c
end

local now = now_us()

local tokens, at, fits, admitted = {}, {}, {}, 1
for i = 1, n do
  local cap, step = capacity[i], interval[i]
  local k, a = bucket_read(KEYS[i], now, step, cap)
  if not k then return fail('key ' .. KEYS[i] .. ' does not hold a token bucket') end
  tokens[i], at[i] = k, a
  fits[i] = cost <= k
  if not fits[i] then admitted = 0 end
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {admitted, now}
for i = 1, n do
  local k, a, step, cap = tokens[i], at[i], interval[i], capacity[i]
  if admitted == 1 then
    k = k - cost
    redis.call('HSET', KEYS[i], 'tokens', k, 'at', a)
    redis.call('PEXPIREAT', KEYS[i], ceil_div(a + (cap - k) * step, 1000))
  end
  local retry, reset = -1, 0
  if not fits[i] then retry = ceil_div(a + (cost - k) * step - now, 1000) end
  if k < cap then reset = ceil_div(math.max(0, a + (cap - k) * step - now), 1000) end
  reply[#reply + 1] = fits[i] and 1 or 0
  reply[#reply + 1] = k
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
