#!lua flags=no-writes
-- rate/token_bucket/peek: what rate/token_bucket/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/token_bucket/check (state: hash {tokens,
-- at}; ARGV[1] cost, then interval T and capacity C per key).
--
-- Reply: {admitted, now, then per bucket: fits, remaining, retry_after, reset_after}
--   as rate/token_bucket/check, except that nothing is charged: admitted
--   says whether check would admit, and remaining is the tokens in the
--   bucket now (refill included), before any charge.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: capacity 10, T = 100000, state {tokens = 2, at = N - 250000}, at
-- now = N, cost 5: two tokens were earned, {0, N, 0, 4, 50, 550}.

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

local now = now_us()

local reply, admitted = {0, now}, 1
for i = 1, n do
  local step, cap = arg_int(2 * i, 1, MAX_FILL), arg_int(2 * i + 1, 1, MAX)
  if not step or not cap or cap * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  if cost > cap then return fail('cost is above the capacity of key ' .. i) end
  local k, a = bucket_read(KEYS[i], now, step, cap)
  if not k then return fail('key ' .. KEYS[i] .. ' does not hold a token bucket') end
  local retry, reset = -1, 0
  if cost > k then
    admitted = 0
    retry = ceil_div(a + (cost - k) * step - now, 1000)
  end
  if k < cap then reset = ceil_div(math.max(0, a + (cap - k) * step - now), 1000) end
  reply[#reply + 1] = cost <= k and 1 or 0
  reply[#reply + 1] = k
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
reply[1] = admitted
return reply
