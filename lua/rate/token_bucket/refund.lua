#!lua flags=allow-oom
-- rate/token_bucket/refund: give back tokens of one admitted charge (only those the bucket has not yet refilled), or settle it at its real cost (charging an excess even into debt).
--
-- KEYS[i]     bucket i (i = 1..n): the string "b<T>x<C>:<tokens>:<at>" as
--             written by rate/token_bucket/check (or a hash of the forms
--             before, lib/bucket);
--             KEYS[n + 1] the charge's record, KEYS[n + 1 + i] bucket i's
--             reset marker (lib/refund).
-- ARGV        as lib/refund: amount, actual, at, cost, settle, cap, then per
--             bucket: interval T (microseconds >= 1 per token), capacity C
--             (>= 1, with C x T <= 2^51), held, reset (unused here); then
--             optionally "adopt" (lib/tag).
--
-- Tags (lib/tag): bucket i's tag is "b<T>x<C>" of its arguments. A bucket
-- tagged by another limit (other numbers, unless adopting; another
-- algorithm) is refused with NOLOCK_STATE, nothing written on any key.
-- Every bucket written is written with its tag.
--
-- The bucket is GCRA in another stored form (see rate/token_bucket/check),
-- and the refund is rate/gcra/refund's, worked on the bucket's full-at time
-- F = at + (C - tokens) x T (GCRA's TAT): tokens the bucket would have
-- refilled by now anyway, had the charge not happened, are not owed back.
-- A settlement below the reservation gives back give = held - actual:
--   back = min(give x T, at + held x T - now) microseconds, never below 0
--   F' = max(now, F - back) when F > now
-- and a settlement above it (excess = actual - held) takes e = min(excess,
-- the units until F is cap units past empty): F' = F' + e x T. The bucket
-- is then written back from F' in the form check keeps: when F' - now <
-- C x T, tokens = floor((C x T - (F' - now)) / T) and at = F' - (C -
-- tokens) x T (in (now - T, now]); otherwise tokens = 0 and at = F' - C x T
-- (>= now): a debt, during which the bucket refills nothing and checks are
-- denied. (Working on F is what keeps a refund into a debt from turning
-- into tokens usable at once: the tokens come back only as the debt
-- drains.)
--
-- A bucket that becomes full is deleted (a missing key means full);
-- otherwise its expiry moves to when it will be full. The record keeps
-- what is left of the charge, or that it was settled, until at + cost x T
-- (after which nothing of it can come back) or its deadline, whichever is
-- later.
--
-- Reply: {status, now, then per bucket: credited, charged, excess, tokens, at}
--   status    0 applied; 1 settled already; 2 the charge's power had
--             ended (its deadline passed, or a limit was reset since)
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
--@include lib/tag
--@include lib/bucket
--@include lib/refund

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local now = now_us()
local n, give, excess, at, cost, settle, cap, held, status, adopt = refund_begin(floor_div(now, 1000))
if not n then return fail(give) end

local interval, capacity, tokens, refilled, back, until_us = {}, {}, {}, {}, {}, at
for i = 1, n do
  local step, c = arg_int(4 * i + 3, 1, MAX_FILL), arg_int(4 * i + 4, 1, MAX)
  if not step or not c or c * step > MAX_FILL then
    return fail('bad interval or capacity for key ' .. i)
  end
  local tag = 'b' .. ARGV[4 * i + 3] .. 'x' .. ARGV[4 * i + 4]
  local k, a = bucket_read(KEYS[i], now, step, c, tag, adopt)
  if not k then
    if a then return tag_refuse(KEYS[i], a, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a token bucket')
  end
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
  local full_at = a + (c - k) * step -- F, the bucket's TAT in GCRA terms
  local f = full_at
  if back[i] > 0 and f > now then f = math.max(now, f - back[i]) end
  credited[i] = ceil_div(full_at - f, step)
  local charged = 0
  if excess[i] > 0 then
    local room = floor_div(math.min(MAX_FILL, (c + cap) * step) - (f - now), step)
    charged = math.max(0, math.min(excess[i], room))
    f = f + charged * step
  end
  if f ~= full_at then
    if f == now then
      k, a = c, now
      redis.call('DEL', KEYS[i])
    else
      k = math.max(0, floor_div(c * step - (f - now), step))
      a = f - (c - k) * step
      bucket_write(KEYS[i], 'b' .. ARGV[4 * i + 3] .. 'x' .. ARGV[4 * i + 4], k, a, step, c)
    end
  end
  local j = 5 * i - 2
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3], reply[j + 4] = credited[i], charged, excess[i], k, a
end
refund_end(n, held, credited, ceil_div(until_us, 1000) + 1, settle, status)
return reply
