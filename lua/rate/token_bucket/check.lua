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
-- Reply: {admitted, now, then per bucket: tokens, at} -- the raw state,
-- from which the client derives every answer (src/rate/state.rs).
--   admitted  1 when every bucket fitted and was charged; else 0
--   now       the server time of the decision, microseconds since the epoch
--   tokens    bucket i's tokens after refill, less cost when admitted (the
--             remaining units; when denied it fitted alone iff cost <= tokens)
--   at        the instant refill is credited up to: retry_after is
--             ceil((at + (cost - tokens) x T - now) / 1000) ms, reset_after
--             ceil((at + (C - tokens) x T - now) / 1000) ms
--
-- Guarantees: every bucket is read and decided before the first write. The
-- decisions are exactly those of rate/gcra/check for the same T and burst = C
-- (TAT = at + (C - tokens) x T); only the stored form differs.
--
-- Example: capacity 10, 10 per second (T = 100000), on a missing key at now = N:
-- {1, N, 9, N}, state {tokens = 9, at = N} (9 remaining, full in 100 ms).

--@include lib/fail
--@include lib/rate

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

-- The checks of lib/args and lib/bucket, written in place (see
-- rate/gcra/check): no helper calls, no table but the reply, whose slots
-- 2i + 1 and 2i + 2 keep bucket i's tokens and at.

local n, cost, now = rate_begin()
if not n then return fail(cost) end

local reply, admitted = {0, now}, 1
for i = 1, n do
  local step, cap = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if not step or not cap or step % 1 ~= 0 or cap % 1 ~= 0 or step < 1 or cap < 1
    or cap * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  if cost > cap then return fail('cost is above the capacity of key ' .. i) end
  -- The state: exactly the fields tokens and at, canonical integers in
  -- [0, 2^53 - 1] (as lib/bucket reads it); missing is a full bucket.
  local k, a = cap, now
  local all = redis.call('HGETALL', KEYS[i])
  if #all > 0 then
    k, a = nil, nil
    if #all == 4 then
      for f = 1, 3, 2 do
        local s = all[f + 1]
        local v = #s <= 16 and (s == '0' or string.find(s, '^[1-9]%d*$')) and tonumber(s)
        if v and v <= MAX then
          if all[f] == 'tokens' then k = v elseif all[f] == 'at' then a = v end
        end
      end
    end
    if not k or not a then
      return fail('key ' .. KEYS[i] .. ' does not hold a token bucket')
    end
    -- Refill up to now, one token per T; a lowered capacity clamps.
    if now > a then
      local add = math.floor((now - a) / step)
      if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
    end
    if k > cap then k = cap end
  end
  if cost > k then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = k, a
end
reply[1] = admitted

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
if admitted == 1 then
  for i = 1, n do
    local k, a = reply[2 * i + 1] - cost, reply[2 * i + 2]
    redis.call('HSET', KEYS[i], 'tokens', k, 'at', a)
    redis.call('PEXPIREAT', KEYS[i], math.ceil((a + (ARGV[2 * i + 1] - k) * ARGV[2 * i]) / 1000))
    reply[2 * i + 1] = k
  end
end
return reply
