#!lua flags=no-writes
-- rate/token_bucket/peek: what rate/token_bucket/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/token_bucket/check (state: the string
-- "b<T>x<C>:<tokens>:<at>", or a hash {tokens, at[, by]} of the forms before
-- (lib/bucket); ARGV[1] cost, then interval T and
-- capacity C per key, then optionally "adopt"). A bucket tagged by another
-- limit is refused as check refuses it (NOLOCK_STATE; with "adopt", any
-- bucket's state is read as it is); a bucket of an older form is read as
-- it is and stays so (peek writes nothing).
--
-- Reply: {admitted, now, then per bucket: tokens, at} as
--   rate/token_bucket/check, except that nothing is charged: admitted says
--   whether check would admit, and tokens are those in the bucket now.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: capacity 10, T = 100000, state {tokens = 2, at = N - 250000}, at
-- now = N, cost 5: two tokens were earned, {0, N, 4, N - 50000} (retry
-- after 50 ms, full in 550 ms).

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/tag
--@include lib/bucket

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n = #KEYS
local adopt = tag_adopt(1 + 2 * n)
if n < 1 or adopt == nil then
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
  local tag = 'b' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1]
  local k, a = bucket_read(KEYS[i], now, step, cap, tag, adopt)
  if not k then
    if a then return tag_refuse(KEYS[i], a, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a token bucket')
  end
  if cost > k then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = k, a
end
reply[1] = admitted
return reply
