-- rate/calendar/check: take `cost` from one or more calendar periods (a month in a customer's zone, a day from 06:00), all or nothing.
--
-- A calendar limit is a counter whose period the client names and the
-- server's clock picks: the client sends the boundaries of three periods
-- around its estimate of the server's time (lib/calendar), computed from
-- the zone's rules; the script takes the one holding TIME. So a client
-- clock that is hours off never counts in a period the server is not in,
-- and never gets the next period's quota early.
--
-- KEYS[i]     limit i: the string "k<h>x<L>:<count>" (lib/tag: the
--             period's tag number and the limit that wrote it, then the
--             units counted in the period, a canonical integer); its expiry
--             (PEXPIRETIME) is the period's end. Missing, or past its end,
--             means empty.
-- ARGV[1]     cost    integer, 1 <= cost <= every limit.
-- ARGV[6i-4 .. 6i+1]  limit i: h, L, b0, b1, b2, b3 (lib/calendar).
-- ARGV[2+6n]  optional "adopt" (lib/tag): a state of another period or
--             limit (same letter) is read as it is, its period kept, and
--             retagged at its admission.
--
-- The tag: a state of another period or limit is refused with
-- NOLOCK_STATE, nothing written on any key, unless the call adopts;
-- another algorithm's state is refused even then.
--
-- Decision, with now = TIME in ms (rounded down), for each limit: a stored
-- period that has not ended (now < its end) is counted in as it is, even
-- when its end is not the one this call computed (two clients with other
-- zone data: the stored period wins until it ends, so one period is never
-- counted twice at once). Otherwise the period is the one of b holding
-- now; when none does, the call is refused with NOLOCK_PERIOD and the
-- server's time, nothing written on any key. A stored period that the
-- client's boundaries place after the one holding now (the server's clock
-- stepped back across a boundary) is not counted in early: the server's
-- own period answers as full until its end. Then
--   fits = count + cost <= L
-- When every limit fits, each adds cost; otherwise nothing is counted.
--
-- Reply: {admitted, now, then per limit: count, end}, as
-- rate/fixed_window/check: count after the call, end the period's end
-- (ms since the epoch), also when nothing is counted in it yet.
--
-- Guarantees: every limit is read and decided before the first write; any
-- number of concurrent callers never push a count past L in one stored
-- period; a period's state expires at its end.
--
-- Example: 3 per period [B1, B2), at now in it, on a missing key with
-- b = {B0, B1, B2, B3}: {1, now_us, 1, B2}; the key holds "k<h>x3:1"
-- until B2.

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/fixed
--@include lib/tag
--@include lib/calendar

local MAX = 9007199254740991

local n = #KEYS
local adopt = n >= 1 and tag_adopt(1 + 6 * n)
if n < 1 or adopt == nil then
  return fail('expected 1 + 6 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local micros = now_us()
local now = math.floor(micros / 1000)

local tags, counts, ends, moved, admitted = {}, {}, {}, {}, 1
for i = 1, n do
  local h, l, b = calendar_args(6 * i - 4)
  if not h then return fail('bad period or limit for key ' .. i) end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  local tag = string.format('k%dx%d', h, l)
  local c, e = fixed_read(KEYS[i], now, tag, adopt, true)
  if not c then
    if e then return tag_refuse(KEYS[i], e, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a counter')
  end
  if not e or e == -1 then
    -- No current period stored (or one without an end): the server's
    -- clock picks it among the client's.
    local pe = calendar_end(b, now)
    if not pe then return calendar_refuse(KEYS[i], now) end
    moved[i] = true
    if not e then c = 0 end
    e = pe
  elseif e > b[2] and (e == b[3] or e == b[4]) then
    -- The stored period is one the client sent as later than the one the
    -- server's clock is in: the clock stepped back across a boundary.
    -- That earlier period's count was replaced; it counts as full until
    -- it ends, so the later one is never spent early.
    local pe = calendar_end(b, now)
    if pe and e > pe then c, e = l, pe end
  end
  if cost > l - c then admitted = 0 end
  tags[i], counts[i], ends[i] = tag, c, e
end

local reply = {admitted, micros}
for i = 1, n do
  local c, e = counts[i], ends[i]
  if admitted == 1 then
    c = c + cost
    local value = string.format('%s:%d', tags[i], c)
    if moved[i] then
      redis.call('SET', KEYS[i], value, 'PXAT', e)
    else
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    end
  end
  reply[2 * i + 1], reply[2 * i + 2] = c, e
end
return reply
