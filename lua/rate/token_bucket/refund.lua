#!lua flags=allow-oom
-- rate/token_bucket/refund: give back tokens of one admitted charge, only those the bucket has not yet refilled.
--
-- KEYS[i]     bucket i (i = 1..n): a hash {tokens, at} as written by
--             rate/token_bucket/check; KEYS[n + 1] the charge's record
--             (lib/refund).
-- ARGV[1]     amount    integer >= 1: tokens to give back.
-- ARGV[2]     at        integer microseconds: the server time of the charge
--                       (the `now` of its reply).
-- ARGV[3]     cost      integer >= 1: what the charge took.
-- ARGV[4i]    interval  T of bucket i, integer microseconds >= 1 per token.
-- ARGV[4i+1]  capacity  C of bucket i, integer >= 1, with C x T <= 2^51.
-- ARGV[4i+2]  held      integer in [0, cost]: the tokens of the charge not
--                       yet given back to bucket i, as the client counts
--                       them; the record's count wins when lower.
-- ARGV[4i+3]  reset     the charge's reset_after on bucket i, ms (unused).
--
-- The bucket is GCRA in another stored form (see rate/token_bucket/check),
-- and the bound is rate/gcra/refund's: tokens the bucket would have refilled
-- by now anyway, had the charge not happened, are not owed back. The
-- bucket, refilled up to now as in check, gets back
--   back = min(amount x T, at + held x T - now) microseconds, never below 0
-- of refill: floor(back / T) whole tokens, and the rest as refill time
-- already credited (`at` moves back by it; a token it completes is added
-- now), never more than its capacity. A bucket that becomes full is deleted
-- (a missing key means full); otherwise its expiry moves to when it will be
-- full. Missing keys stay missing. The record keeps what is left of the
-- charge until at + cost x T, after which nothing of it can come back.
--
-- Reply: {released_1, remaining_1, ..., released_n, remaining_n}
--   released   the tokens of the charge given back: ceil of the refill
--              time returned over T (one partly refilled counts as given
--              back)
--   remaining  tokens in bucket i afterwards
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: capacity 10, 10 per second. Ten tokens taken at N; refund 10 at
-- N + 300000: 3 tokens have refilled, 7 are owed back: {7, 10}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/bucket
--@include lib/refund

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n, amount, at, cost, held = refund_begin()
if not n then return fail(amount) end

local now = now_us()

local interval, capacity, tokens, refilled, back, until_us = {}, {}, {}, {}, {}, at
for i = 1, n do
  local step, cap = arg_int(4 * i, 1, MAX_FILL), arg_int(4 * i + 1, 1, MAX)
  if not step or not cap or cap * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  local k, a = bucket_read(KEYS[i], now, step, cap)
  if not k then return fail('key ' .. KEYS[i] .. ' does not hold a token bucket') end
  local h = math.min(held[i], amount, cap) -- a charge never holds more than the capacity
  interval[i], capacity[i], tokens[i], refilled[i] = step, cap, k, a
  back[i] = math.max(0, math.min(h * step, at + h * step - now))
  until_us = math.max(until_us, at + math.min(cost, cap) * step)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {}, {}
for i = 1, n do
  local cap, step, k, a = capacity[i], interval[i], tokens[i], refilled[i]
  local full_at = a + (cap - k) * step -- the bucket's TAT, in GCRA terms
  if back[i] > 0 and k < cap then
    local whole = floor_div(back[i], step)
    k, a = k + whole, a - (back[i] - whole * step)
    if now - a >= step then k, a = k + 1, a + step end
    if k >= cap then
      k, a = cap, now
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'tokens', k, 'at', a)
      redis.call('PEXPIREAT', KEYS[i], ceil_div(a + (cap - k) * step, 1000))
    end
  end
  credited[i] = ceil_div(full_at - (a + (cap - k) * step), step)
  reply[#reply + 1] = credited[i]
  reply[#reply + 1] = k
end
refund_end(n, held, credited, ceil_div(until_us, 1000) + 1)
return reply
