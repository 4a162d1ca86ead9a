#!lua flags=allow-oom
-- rate/gcra/refund: give back units of one admitted charge, only the part the limit has not yet drained.
--
-- KEYS[i]     limit i (i = 1..n), as in rate/gcra/check (TAT, integer
--             microseconds); KEYS[n + 1] the charge's record (lib/refund).
-- ARGV[1]     amount    integer >= 1: units to give back.
-- ARGV[2]     at        integer microseconds: the server time of the charge
--                       (the `now` of its reply).
-- ARGV[3]     cost      integer >= 1: what the charge took.
-- ARGV[4i]    interval  T of limit i, integer microseconds >= 1.
-- ARGV[4i+1]  burst     b of limit i, integer >= 1, with b x T <= 2^51.
-- ARGV[4i+2]  held      integer in [0, cost]: the units of the charge not
--                       yet given back on limit i, as the client counts
--                       them; the record's count wins when lower.
-- ARGV[4i+3]  reset     the charge's reset_after on limit i, ms (unused
--                       here; every rate refund takes the same arguments).
--
-- A charge of c units admitted at `at` holds the limit for at least the
-- span [at, at + c x T] of the limiter's schedule (it started no earlier
-- than its own arrival), and later calls stack on top of it. By now, the
-- part of it behind now has drained: the limiter would have refilled that
-- much whether or not the charge happened. So a refund gives back
--   back = min(amount x T, at + held x T - now) microseconds, never below 0
-- of the schedule: TAT' = max(now, TAT - back). A refund after the charge
-- drained gives back nothing; capacity never rises above what it would be
-- had the refunded units never been charged, however refunds interleave.
-- The key is deleted when TAT' = now (full). The record keeps what is
-- left of the charge until at + cost x T, after which no refund of it can
-- give anything back on any limit.
--
-- Reply: {released_1, remaining_1, ..., released_n, remaining_n}
--   released   ceil((TAT - TAT') / T): the units of the charge given back
--              (a unit partly drained counts as given back: the charge
--              holds it no more, so a later refund of the same charge cannot
--              give it back again)
--   remaining  units that fit now on limit i, after the refund
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: 10 per second, burst 10 (T = 100000). Ten units taken at N.
-- Refund 10 at N + 300000: back = 700000, TAT' = now: {7, 10}. The same
-- refund at N + 1050000, after others took 10 more: back = 0: {0, 0}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/gcra
--@include lib/refund

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n, amount, at, cost, held = refund_begin()
if not n then return fail(amount) end

local now = now_us()

local interval, burst, tat, back, until_us = {}, {}, {}, {}, at
for i = 1, n do
  local step, b = arg_int(4 * i, 1, MAX_FILL), arg_int(4 * i + 1, 1, MAX)
  if not step or not b or b * step > MAX_FILL then
    return fail('bad interval or burst for key ' .. i)
  end
  local t = gcra_tat(KEYS[i], now)
  if not t then return fail('key ' .. KEYS[i] .. ' does not hold a GCRA state') end
  local h = math.min(held[i], amount, b) -- a charge never holds more than the burst
  interval[i], burst[i], tat[i] = step, b, t
  back[i] = math.max(0, math.min(h * step, at + h * step - now))
  until_us = math.max(until_us, at + math.min(cost, b) * step)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {}, {}
for i = 1, n do
  local t, step = tat[i], interval[i]
  local before = t
  if back[i] > 0 and t > now then
    t = math.max(now, t - back[i])
    if t == now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], t, 'PXAT', ceil_div(t, 1000))
    end
  end
  local room = burst[i] * step - (t - now)
  credited[i] = ceil_div(before - t, step)
  reply[#reply + 1] = credited[i]
  reply[#reply + 1] = room > 0 and floor_div(room, step) or 0
end
refund_end(n, held, credited, ceil_div(until_us, 1000) + 1)
return reply
