#!lua flags=allow-oom
-- rate/gcra/refund: give back units of one admitted charge (only the part the limit has not yet drained), or settle it at its real cost (charging an excess even into debt).
--
-- KEYS[i]     limit i (i = 1..n), as in rate/gcra/check (TAT, integer
--             microseconds); KEYS[n + 1] the charge's record, KEYS[n + 1 + i]
--             limit i's reset marker (lib/refund).
-- ARGV        as lib/refund: amount, actual, at, cost, settle, cap, then per
--             limit: interval T (microseconds >= 1), burst b (>= 1, with
--             b x T <= 2^51), held, reset (unused here).
--
-- Refund (and a settlement below the reservation, which gives back
-- held - actual): a charge of c units admitted at `at` holds the limit for at
-- least the span [at, at + c x T] of the limiter's schedule (it started no
-- earlier than its own arrival), and later calls stack on top of it. By
-- now, the part of it behind now has drained (its first units first): the
-- limiter would have refilled that much whether or not the charge
-- happened. So giving back `give` of the `held` units it still holds gives
-- back its tail,
--   back = min(give x T, at + held x T - now) microseconds, never below 0
-- of the schedule: TAT' = max(now, TAT - back). A refund after the charge
-- drained gives back nothing; capacity never rises above what it would be
-- had the refunded units never been charged, however refunds interleave.
-- The key is deleted when TAT' = now (full).
--
-- Excess (a settlement above the reservation: actual - held): TAT' = TAT
-- + e x T with e = min(excess, floor((min(2^51, (b + cap) x T) - (TAT - now)) / T)),
-- never below 0: the limit may go past empty, into debt, by up to `cap`
-- units; checks are then denied until the debt has drained.
--
-- The record keeps what is left of the charge, or that it was settled,
-- until at + cost x T (after which no refund of it can give anything back
-- on any limit) or its deadline, whichever is later.
--
-- Reply: {status, now, then per limit: credited, charged, excess, tat}
--   status    0 applied; 1 the charge was settled already; 2 the
--             charge's power had ended: its deadline passed, or a limit
--             was reset since it was taken (nothing changed for 1, 2)
--   now       the server time, microseconds
--   credited  ceil((TAT - TAT') / T) for a refund: the units of the charge
--             given back (a unit partly drained counts as given back: the
--             charge holds it no more)
--   charged   e: the excess units charged
--   excess    the units the settlement asked to charge (actual - held)
--   tat       limit i's TAT afterwards, at least now (the raw state: the
--             client derives remaining and debt from it, src/rate/state.rs)
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: 10 per second, burst 10 (T = 100000). Ten units taken at N.
-- Refund 10 at N + 300000: back = 700000, TAT' = now: {0, now, 7, 0, 0, now}.
-- The same refund at N + 1050000, after others took 10 more: back = 0:
-- {0, now, 0, 0, 0, N + 2000000}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/gcra
--@include lib/refund

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local now = now_us()
local n, give, excess, at, cost, settle, cap, held, status, adopt = refund_begin(floor_div(now, 1000))
if not n then return fail(give) end

local interval, burst, tat, back, tags, until_us = {}, {}, {}, {}, {}, at
for i = 1, n do
  local step, b = arg_int(4 * i + 3, 1, MAX_FILL), arg_int(4 * i + 4, 1, MAX)
  if not step or not b or b * step > MAX_FILL then
    return fail('bad interval or burst for key ' .. i)
  end
  tags[i] = 'g' .. ARGV[4 * i + 3] .. 'x' .. ARGV[4 * i + 4]
  local t, refused = gcra_tat(KEYS[i], now, tags[i], adopt)
  if not t then return refused end
  -- A charge never holds more than the burst. What goes back is the tail
  -- of what it still holds: its first units drained first.
  local h = math.min(held[i], b)
  interval[i], burst[i], tat[i] = step, b, t
  back[i] = math.max(0, math.min(math.min(give[i], h) * step, at + h * step - now))
  until_us = math.max(until_us, at + math.min(cost, b) * step)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {status, now}, {}
for i = 1, n do
  local t, step = tat[i], interval[i]
  local before = t
  if back[i] > 0 and t > now then t = math.max(now, t - back[i]) end
  credited[i] = ceil_div(before - t, step)
  local charged = 0
  if excess[i] > 0 then
    local room = floor_div(math.min(MAX_FILL, (burst[i] + cap) * step) - (t - now), step)
    charged = math.max(0, math.min(excess[i], room))
    t = t + charged * step
  end
  if t ~= before then
    if t == now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], tags[i] .. ':' .. string.format('%d', t), 'PXAT', ceil_div(t, 1000))
    end
  end
  local j = 4 * i - 1
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = credited[i], charged, excess[i], t
end
refund_end(n, held, credited, ceil_div(until_us, 1000) + 1, settle, status)
return reply
