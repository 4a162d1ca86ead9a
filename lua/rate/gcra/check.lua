-- rate/gcra/check: take `cost` units from one or more GCRA limits, all or nothing.
--
-- GCRA (generic cell rate algorithm) keeps one number per limit: the
-- theoretical arrival time TAT, the instant at which the limiter is full
-- again if nothing more arrives. Each unit of cost pushes TAT one emission
-- interval T further; a call fits while TAT stays within burst x T of now.
-- (It is a token bucket written as one timestamp: the tokens left are
-- floor((now + burst x T - TAT) / T).)
--
-- KEYS[i]     limit i: a string holding TAT, integer microseconds since the
--             Unix epoch by the server clock. Missing, or in the past, means
--             full. It expires (PXAT) at TAT rounded up to the millisecond:
--             an idle limiter costs no memory.
-- ARGV[1]     cost      integer, 1 <= cost <= every burst: units to take.
-- ARGV[2i]    interval  T of limit i, integer microseconds >= 1: period / rate
--                       (rounded up by the caller).
-- ARGV[2i+1]  burst     b of limit i, integer >= 1, with b x T <= 2^51.
--
-- Decision, with now = TIME in microseconds, for each limit:
--   tat  = max(TAT, now)
--   fits = (tat - now) + cost x T <= b x T
-- When every limit fits, each stores TAT' = tat + cost x T; otherwise
-- nothing is written (a denied call consumes nothing, on any limit).
--
-- Reply: {admitted, now, then per limit: fits, remaining, retry_after, reset_after}
--   admitted     1 when every limit fitted and was charged; else 0
--   now          the server time of the decision, microseconds since the epoch
--   fits         1 when this limit on its own had room for cost
--   remaining    units that fit right now, after this call:
--                floor((b x T - (tat - now)) / T), never below 0
--   retry_after  milliseconds (rounded up) until cost fits on this limit if
--                nothing else arrives; -1 when it fits now
--   reset_after  milliseconds (rounded up) until this limit is full again
--
-- Guarantees: every limit is read and decided before the first write, so the
-- call is all or nothing even across several keys. Any number of concurrent
-- callers never get more than b + floor(d / T) units in d microseconds.
--
-- Example: 10 per second, burst 10 (T = 100000, b = 10), on a missing key at
-- now = N: {1, N, 1, 9, -1, 100}. Ten quick calls leave remaining 9, 8, ..., 0;
-- an eleventh at N + 2000 gets {0, N + 2000, 0, 0, 98, 998}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/gcra

local MAX = 9007199254740991      -- 2^53 - 1: Lua numbers are doubles

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).

local interval, burst = {}, {}
for i = 1, n do
  local step, b = gcra_limit(i, cost)
  if not step then return fail('bad interval or burst, or cost above the burst, for key ' .. i) end
  interval[i], burst[i] = step, b
end

local now = now_us()

local tat, fits, admitted = {}, {}, 1
for i = 1, n do
  local t = gcra_tat(KEYS[i], now)
  if not t then return fail('key ' .. KEYS[i] .. ' does not hold a GCRA state') end
  tat[i] = t
  fits[i] = (t - now) + cost * interval[i] <= burst[i] * interval[i]
  if not fits[i] then admitted = 0 end
end

local reply = {admitted, now}
for i = 1, n do
  local t, step = tat[i], interval[i]
  if admitted == 1 then
    t = t + cost * step
    redis.call('SET', KEYS[i], t, 'PXAT', ceil_div(t, 1000))
  end
  local j = 4 * i - 1
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3] =
    gcra_answer(t, now, cost, step, burst[i], fits[i])
end
return reply
