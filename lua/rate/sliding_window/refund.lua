#!lua flags=allow-oom
-- rate/sliding_window/refund: give back units of one admitted charge (from the window that counted it, while it still counts), or settle it at its real cost (charging an excess to the current window, even past its limit).
--
-- KEYS[i]     limit i (i = 1..n): the string "s<w>x<L>:<start>:<count>:
--             <previous>" as written by rate/sliding_window/check (or a
--             hash of the forms before, lib/window); KEYS[n + 1] the charge's record,
--             KEYS[n + 1 + i] limit i's reset marker (lib/refund).
-- ARGV        as lib/refund: amount, actual, at, cost, settle, cap, then per
--             limit: window w (ms >= 1), limit L (>= 1, with L x w <=
--             2^53 - 1), held, reset (unused: windows are aligned on the
--             epoch, so `at` names the window); then optionally "adopt"
--             (lib/tag).
--
-- Tags (lib/tag): limit i's tag is "s<w>x<L>" of its arguments. A limit
-- tagged by another limit (other numbers, unless adopting; another
-- algorithm) is refused with NOLOCK_STATE, nothing written on any key.
-- Every limit written is written with its tag.
--
-- Refund (and a settlement below the reservation, which gives back give =
-- held - actual): the charge was counted in the aligned window s = floor(at_ms / w)
-- x w. After rolling the state to now (as check does): when the current
-- window is s, its count drops by min(amount, held, count); when it is
-- s + w, the charge is in `previous`, which drops by min(amount, held,
-- previous); when the charge's window is older, it no longer counts and
-- nothing is given back.
--
-- Excess (a settlement above the reservation: actual - held): the current
-- window counts e = min(excess, L + cap - count) more units, never below 0: past L, a
-- debt that denies every check of this window; in the next one it weighs
-- as `previous`, which checks read as at most L.
--
-- The state is stored rolled; a state that becomes empty is deleted. The
-- record keeps what is left of the charge, or that it was settled, until
-- s + 2w (the end of the window after s, after which the charge counts
-- nowhere) or its deadline, whichever is later.
--
-- Reply: {status, now, then per limit: credited, charged, excess, start, count, previous}
--   status    0 applied; 1 settled already; 2 the charge's power had
--             ended (its deadline passed, or a limit was reset since)
--   credited  units taken off the window that counted the charge
--   charged   e: the excess units counted
--   excess    the units the settlement asked to count (actual - held)
--   start, count, previous  the state afterwards, rolled to now (the raw
--             state, src/rate/state.rs)
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: limit 10 per 1000 ms; 4 charged at 1500 ms (window 1000), state
-- rolled at 2300 ms to {start 2000, count 2, previous 4}: a refund of 4
-- takes them from previous: {0, now, 4, 0, 0, 2000, 2, 0}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/tag
--@include lib/window
--@include lib/refund

local MAX = 9007199254740991

local micros = now_us()
local now = floor_div(micros, 1000)
local n, give, excess, at, cost, settle, cap, held, status, adopt = refund_begin(now)
if not n then return fail(give) end
local charged_ms = floor_div(at, 1000)

local window, limit, start, count, previous, from, most = {}, {}, {}, {}, {}, {}, {}
local until_ms = now
for i = 1, n do
  local w, l = arg_int(4 * i + 3, 1, MAX), arg_int(4 * i + 4, 1, MAX)
  if not w or not l or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  local tag = 's' .. ARGV[4 * i + 3] .. 'x' .. ARGV[4 * i + 4]
  local cur, c, p = window_read(KEYS[i], now, w, tag, adopt)
  if not cur then
    if c then return tag_refuse(KEYS[i], c, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a sliding window')
  end
  local s = floor_div(charged_ms, w) * w
  if cur == s then from[i] = 'count' elseif cur == s + w then from[i] = 'previous' end
  window[i], limit[i], start[i], count[i], previous[i] = w, l, cur, c, p
  most[i] = give[i]
  until_ms = math.max(until_ms, s + 2 * w)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply, credited = {status, micros}, {}
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
  local charged = 0
  if excess[i] > 0 then
    charged = math.max(0, math.min(excess[i], l + cap - c, MAX - c))
    c = c + charged
  end
  if back > 0 or charged > 0 then
    if c == 0 and p == 0 then
      redis.call('DEL', KEYS[i])
    else
      window_write(KEYS[i], 's' .. ARGV[4 * i + 3] .. 'x' .. ARGV[4 * i + 4], cur, c, p, w)
    end
  end
  credited[i] = back
  local j = 6 * i - 3
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3], reply[j + 4], reply[j + 5] =
    back, charged, excess[i], cur, c, p
end
refund_end(n, held, credited, until_ms + 1, settle, status)
return reply
