#!lua flags=allow-oom
-- rate/sliding_window/refund: give back units of one admitted charge, from the window that counted it, while it still counts.
--
-- KEYS[i]     limit i (i = 1..n): a hash {start, count, previous} as
--             written by rate/sliding_window/check; KEYS[n + 1] the charge's
--             record (lib/refund).
-- ARGV[1]     amount  integer >= 1: units to give back.
-- ARGV[2]     at      integer microseconds: the server time of the charge
--                     (the `now` of its reply).
-- ARGV[3]     cost    integer >= 1: what the charge took.
-- ARGV[4i]    window  w of limit i, integer milliseconds >= 1.
-- ARGV[4i+1]  limit   L of limit i, integer >= 1, with L x w <= 2^53-1.
-- ARGV[4i+2]  held    integer in [0, cost]: the units of the charge not yet
--                     given back on limit i, as the client counts them; the
--                     record's count wins when lower.
-- ARGV[4i+3]  reset   the charge's reset_after on limit i (unused: windows
--                     are aligned on the epoch, so `at` names the window).
--
-- The charge was counted in the aligned window s = floor(at_ms / w) x w.
-- After rolling the state to now (as check does): when the current window
-- is s, its count drops by min(amount, held, count); when it is s + w, the
-- charge is in `previous`, which drops by min(amount, held, previous); when the charge's
-- window is older, it no longer counts and nothing is given back. The
-- state is stored rolled; a state that becomes empty is deleted.
--
-- Reply: {credited_1, remaining_1, ..., credited_n, remaining_n}
--   credited   units taken off the window that counted the charge
--   remaining  units that fit now on limit i, after the refund:
--              L - count - ceil(previous x (w - e) / w), never below 0
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: limit 10 per 1000 ms; 4 charged at 1500 ms (window 1000), state
-- rolled at 2300 ms to {start 2000, count 2, previous 4}: a refund of 4
-- takes them from previous: {4, 8}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/window
--@include lib/refund

local MAX = 9007199254740991

local n, amount, at, cost, held = refund_begin()
if not n then return fail(amount) end

local now = floor_div(now_us(), 1000)
local charged_ms = floor_div(at, 1000)

local window, limit, start, count, previous, from, most = {}, {}, {}, {}, {}, {}, {}
local until_ms = now
for i = 1, n do
  local w, l = arg_int(4 * i, 1, MAX), arg_int(4 * i + 1, 1, MAX)
  if not w or not l or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  local cur, c, p = window_read(KEYS[i], now, w)
  if not cur then return fail('key ' .. KEYS[i] .. ' does not hold a sliding window') end
  local s = floor_div(charged_ms, w) * w
  if cur == s then from[i] = 'count' elseif cur == s + w then from[i] = 'previous' end
  window[i], limit[i], start[i], count[i], previous[i] = w, l, cur, c, p
  most[i] = math.min(amount, held[i])
  until_ms = math.max(until_ms, s + 2 * w)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {}, {}
for i = 1, n do
  local w, l, cur, c, p = window[i], limit[i], start[i], count[i], previous[i]
  local back = 0
  if from[i] == 'count' then
    back = math.min(most[i], c)
    c = c - back
  elseif from[i] == 'previous' then
    back = math.min(most[i], p)
    p = p - back
  end
  if back > 0 then
    if c == 0 and p == 0 then
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'start', cur, 'count', c, 'previous', p)
      redis.call('PEXPIREAT', KEYS[i], cur + 2 * w)
    end
  end
  local e = math.max(0, now - cur)
  c, p = math.min(c, l), math.min(p, l)
  credited[i] = back
  reply[#reply + 1] = back
  reply[#reply + 1] = math.max(0, l - c - ceil_div(p * (w - e), w))
end
refund_end(n, held, credited, until_ms + 1)
return reply
