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

-- The checks of lib/args, lib/calendar, lib/fixed and lib/tag, and lib/fail's
-- errors, written in place (as rate/fixed_window/check): no helper calls.
-- Arguments convert by arithmetic (tonumber parses a string twice): a
-- non-numeric one raises Lua's own error, still before any write, so the
-- refusal stays definite.

local MAX = 9007199254740991

local n = #KEYS
local adopt = #ARGV == 2 + 6 * n and ARGV[2 + 6 * n] == 'adopt'
if n < 1 or (#ARGV ~= 1 + 6 * n and not adopt) then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': expected 1 + 6 arguments per key, got '
    .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = ARGV[1] + 0
if cost % 1 ~= 0 or cost < 1 or cost > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad cost: ' .. ARGV[1])
end
local time = redis.call('TIME')
local micros = time[1] * 1000000 + time[2]
local now = math.floor(micros / 1000) -- exact: micros < 2^53 (lib/div)

-- Per limit, slots 4i-1 .. 4i+2 of the reply keep its count, its end, its
-- tag and whether the admission opens the period (sets its expiry).
local reply, admitted = {0, micros, 0, 0, 0, 0}, 1
for i = 1, n do
  local j = 6 * i - 4
  local h, l = ARGV[j] + 0, ARGV[j + 1] + 0
  local b1, b2, b3, b4 = ARGV[j + 2] + 0, ARGV[j + 3] + 0, ARGV[j + 4] + 0, ARGV[j + 5] + 0
  if h % 1 ~= 0 or l % 1 ~= 0 or b1 % 1 ~= 0 or b2 % 1 ~= 0 or b3 % 1 ~= 0 or b4 % 1 ~= 0
    or h < 0 or h > 4294967295 or l < 1 or l > MAX or b1 < 0 or b2 <= b1 or b3 <= b2
    or b4 <= b3 or b4 > MAX then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad period or limit for key ' .. i)
  end
  if cost > l then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': cost is above the limit of key ' .. i)
  end
  -- The end of the period holding now among the client's (lib/calendar).
  local pe = now >= b1 and now < b4 and (now < b2 and b2 or now < b3 and b3 or b4)
  local prefix = 'k' .. ARGV[j] .. 'x' .. ARGV[j + 1] .. ':'
  local c, e, opens = 0, nil, false
  local stored = redis.call('GET', KEYS[i])
  if stored then
    -- Its own tag costs one comparison of the prefix; another tag is
    -- looked at only then (lib/tag); an untagged value is foreign
    -- (calendar states were tagged from the start).
    local len = #prefix
    local tagged = string.sub(stored, 1, len) == prefix
    if tagged then
      stored = string.sub(stored, len + 1)
    else
      local colon = #stored <= 51 and string.find(stored, ':', 1, true)
      local by = colon and string.sub(stored, 1, colon - 1)
      if by and (string.find(by, '^[a-z]%d+x%d+$') or string.find(by, '^m%d+$')) then
        if not (adopt and string.byte(by, 1) == 107) then -- 'k'
          return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
            .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
            .. '; nothing was written')
        end
        stored, tagged = string.sub(stored, colon + 1), true
      end
    end
    c = tagged and #stored <= 16 and (stored == '0' or string.find(stored, '^[1-9]%d*$')) and stored + 0
    if not c or c > MAX then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a counter')
    end
    e = redis.call('PEXPIRETIME', KEYS[i])
    if e >= 0 and now >= e then c, e = 0, nil end
  end
  if not e or e == -1 then
    -- No current period stored (or one without an end): the server's
    -- clock picks it among the client's; in none of them, refused with
    -- the server's time, nothing written (lib/calendar).
    if not pe then
      return redis.error_reply('NOLOCK_PERIOD nolock ' .. SCRIPT_NAME .. ': the server time '
        .. string.format('%d', now) .. ' ms is outside the periods sent for ' .. KEYS[i]
        .. '; nothing was written')
    end
    e, opens = pe, true
  elseif pe and e > pe and (e == b3 or e == b4) then
    -- The stored period is one the client sent as later than the one the
    -- server's clock is in: the clock stepped back across a boundary.
    -- That earlier period's count was replaced; it counts as full until
    -- it ends, so the later one is never spent early.
    c, e = l, pe
  end
  if cost > l - c then admitted = 0 end
  local k = 4 * i - 1
  reply[k], reply[k + 1], reply[k + 2], reply[k + 3] = c, e, prefix, opens
end
reply[1] = admitted

-- Every write is the tagged count, its numbers as text formatted with %d
-- (see rate/gcra/check); the period (expiry) set with it, or kept.
for i = 1, n do
  local k = 4 * i - 1
  local c, e = reply[k], reply[k + 1]
  if admitted == 1 then
    c = c + cost
    local value = reply[k + 2] .. string.format('%d', c)
    if reply[k + 3] then
      redis.call('SET', KEYS[i], value, 'PXAT', string.format('%d', e))
    else
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    end
  end
  reply[2 * i + 1], reply[2 * i + 2] = c, e
end
for k = 2 * n + 3, 4 * n + 2 do reply[k] = nil end
return reply
