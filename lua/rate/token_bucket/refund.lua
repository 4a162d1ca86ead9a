#!lua flags=allow-oom
-- rate/token_bucket/refund: put `amount` tokens back into one or more token buckets.
--
-- KEYS[i]     bucket i: a hash {tokens, at} as written by rate/token_bucket/check.
-- ARGV[1]     amount    integer, 1 <= amount <= 2^53-1: tokens to put back.
-- ARGV[2i]    interval  T of bucket i, integer microseconds >= 1 per token.
-- ARGV[2i+1]  capacity  C of bucket i, integer >= 1, with C x T <= 2^51.
--
-- Each bucket is refilled up to now as in check, then gets
-- min(C, tokens + amount): a bucket never holds more than its capacity. A
-- bucket that becomes full is deleted (a missing key means full); otherwise
-- its expiry moves to when it will be full. Missing keys stay missing.
--
-- Reply: {remaining_1, ..., remaining_n}: tokens in each bucket afterwards.
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key is read and checked before the first write.
--
-- Example: capacity 10, state {tokens = 4, at = now}: refund 3 gives {7};
-- refund 30 deletes the key and gives {10}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/stored
--@include lib/time

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local amount = arg_int(1, 1, MAX)
if not amount then return fail('bad amount: ' .. tostring(ARGV[1])) end

local now = now_us()

local interval, capacity, tokens, at = {}, {}, {}, {}
for i = 1, n do
  local step, cap = arg_int(2 * i, 1, MAX_FILL), arg_int(2 * i + 1, 1, MAX)
  if not step or not cap or cap * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  interval[i], capacity[i] = step, cap
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  if not (state[1] or state[2]) and redis.call('EXISTS', KEYS[i]) == 1 then
    return fail('key ' .. i .. ' does not hold a token bucket')
  end
  if state[1] or state[2] then
    local k, a = stored_int(state[1], 0, MAX), stored_int(state[2], 0, MAX)
    if not k or not a then
      return fail('key ' .. i .. ' does not hold a token bucket')
    end
    if now > a then
      local add = floor_div(now - a, step)
      if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
    end
    tokens[i], at[i] = k, a
  end
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {}
for i = 1, n do
  local cap, step = capacity[i], interval[i]
  local k, a = tokens[i], at[i]
  if k == nil then
    k = cap
  else
    k = math.min(cap, k + amount)
    if k == cap then
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'tokens', k, 'at', a)
      redis.call('PEXPIREAT', KEYS[i], ceil_div(a + (cap - k) * step, 1000))
    end
  end
  reply[i] = k
end
return reply
