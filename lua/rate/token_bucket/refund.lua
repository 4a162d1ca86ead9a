#!lua flags=allow-oom
-- rate/token_bucket/refund: give back tokens of one admitted charge (only those the bucket has not yet refilled), or settle it at its real cost (charging an excess even into debt).
--
-- KEYS[i]     bucket i (i = 1..n): a hash {tokens, at} as written by
--             rate/token_bucket/check; KEYS[n + 1] the charge's record
--             (lib/refund).
-- ARGV        as lib/refund: amount, actual, at, cost, settle, cap, then per
--             bucket: interval T (microseconds >= 1 per token), capacity C
--             (>= 1, with C x T <= 2^51), held, reset (unused here).
--
-- The bucket is GCRA in another stored form (see rate/token_bucket/check),
-- and the bound is rate/gcra/refund's: tokens the bucket would have refilled
-- by now anyway, had the charge not happened, are not owed back. A
-- settlement below the reservation gives back give = held - actual. The
-- bucket, refilled up to now as in check, gets back
--   back = min(give x T, at + held x T - now) microseconds, never below 0
-- of refill: floor(back / T) whole tokens, and the rest as refill time
-- already credited (`at` moves back by it; a token it completes is added
-- now), never more than its capacity.
--
-- Excess (a settlement above the reservation: actual - held): e =
-- min(excess, the units
-- until the bucket's schedule is cap units past empty) tokens are taken;
-- those beyond the tokens in the bucket move `at` into the future by T
-- each: a debt, during which the bucket refills nothing and checks are
-- denied.
--
-- A bucket that becomes full is deleted (a missing key means full);
-- otherwise its expiry moves to when it will be full. The record keeps
-- what is left of the charge until at + cost x T, after which nothing of
-- it can come back; a settlement marks it settled until its deadline.
--
-- Reply: {status, now, then per bucket: credited, charged, excess, tokens, at}
--   status    0 applied; 1 settled already; 2 past the settlement's deadline
--   credited  the tokens of the charge given back: ceil of the refill time
--             returned over T (one partly refilled counts as given back)
--   charged   e: the excess tokens taken
--   excess    the tokens the settlement asked to take (actual - held)
--   tokens, at  the bucket afterwards (the raw state: the client derives
--             remaining and debt from it, src/rate/state.rs)
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: capacity 10, 10 per second. Ten tokens taken at N; refund 10 at
-- N + 300000: 3 tokens have refilled, 7 are owed back: {0, now, 7, 0, 0, 10, now}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/bucket
--@include lib/refund

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local now = now_us()
local n, give, excess, at, cost, settle, cap, held, status = refund_begin(floor_div(now, 1000))
if not n then return fail(give) end

local interval, capacity, tokens, refilled, back, until_us = {}, {}, {}, {}, {}, at
for i = 1, n do
  local step, c = arg_int(4 * i + 3, 1, MAX_FILL), arg_int(4 * i + 4, 1, MAX)
  if not step or not c or c * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  local k, a = bucket_read(KEYS[i], now, step, c)
  if not k then return fail('key ' .. KEYS[i] .. ' does not hold a token bucket') end
  -- A charge never holds more than the capacity. What goes back is the
  -- tail of what it still holds: its first tokens refilled first.
  local h = math.min(held[i], c)
  interval[i], capacity[i], tokens[i], refilled[i] = step, c, k, a
  back[i] = math.max(0, math.min(math.min(give[i], h) * step, at + h * step - now))
  until_us = math.max(until_us, at + math.min(cost, c) * step)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {status, now}, {}
for i = 1, n do
  local c, step, k, a = capacity[i], interval[i], tokens[i], refilled[i]
  local k0, a0 = k, a
  local full_at = a + (c - k) * step -- the bucket's TAT, in GCRA terms
  if back[i] > 0 and k < c then
    local whole = floor_div(back[i], step)
    k, a = k + whole, a - (back[i] - whole * step)
    if now - a >= step then k, a = k + 1, a + step end
    if k >= c then k, a = c, now end
  end
  credited[i] = ceil_div(full_at - (a + (c - k) * step), step)
  local charged = 0
  if excess[i] > 0 then
    local ahead = a + (c - k) * step - now
    local room = floor_div(math.min(MAX_FILL, (c + cap) * step) - ahead, step)
    charged = math.max(0, math.min(excess[i], room))
    if charged <= k then
      k = k - charged
    else
      a, k = a + (charged - k) * step, 0
    end
  end
  if k ~= k0 or a ~= a0 then
    if k >= c then
      k, a = c, now
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'tokens', k, 'at', a)
      redis.call('PEXPIREAT', KEYS[i], ceil_div(a + (c - k) * step, 1000))
    end
  end
  local j = 5 * i - 2
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3], reply[j + 4] = credited[i], charged, excess[i], k, a
end
refund_end(n, held, credited, ceil_div(until_us, 1000) + 1, settle, status)
return reply
