-- rate/fixed_window/check: take `cost` from one or more fixed windows, all or nothing.
--
-- The bounded counter with a window (as limits/try_increment): a limit is a
-- counter whose expiry is the end of its window. The first admission opens
-- the window; once it ends, counting starts again from zero. Windows start
-- when a limiter is first used, not on the clock, so the windows of
-- different users do not all end at the same instant.
--
-- KEYS[i]     limit i: the string "f<w>x<L>:<count>" (lib/tag: the window
--             and limit that wrote it, then the units admitted in the
--             current window, a canonical integer); its expiry
--             (PEXPIRETIME) is the window's end. Missing, or past its end,
--             means empty. A bare count (written before tags) is read as
--             before and tagged at the limit's next admission.
-- ARGV[1]     cost    integer, 1 <= cost <= every limit.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1: an admission
--                     into an empty limit opens the window [now, now + w).
-- ARGV[2i+1]  limit   L of limit i, integer >= 1.
-- ARGV[2n+2]  optional "adopt" (lib/rate, lib/tag): a window of other
--             numbers is read as it is and retagged at its admission.
--
-- The tag: a state of other numbers is refused with NOLOCK_STATE, nothing
-- written on any key, unless the call adopts; another limit's state
-- (another tag letter: a GCRA TAT, a counter) is refused even then. A
-- denial writes no tag.
--
-- Decision, with now = TIME in ms (rounded down), for each limit: a window
-- has ended when now >= its end (compared here with TIME rather than left
-- to Redis's expiry, which uses another reading of the clock and keeps a key
-- through the millisecond its expiry names); then
--   fits = count + cost <= L
-- When every limit fits, each adds cost (an ended or missing window is
-- replaced by a new one holding cost); otherwise nothing is counted (a denied
-- call consumes nothing, on any limit). A counter found without an expiry
-- (written by something else) is given the end now + w, so that it cannot
-- block forever.
--
-- Reply: {admitted, now, then per limit: count, end} -- the raw state,
-- from which the client derives every answer (src/rate/state.rs):
--   admitted  1 when every limit fitted and was charged; else 0
--   now       the server time of the decision, microseconds since the epoch
--   count     the window's count after the call (0 when it ended)
--   end       the window's end, ms since the epoch; 0 when there is none
-- fits (when denied): cost <= L - count; remaining: L - count, never below
-- 0; retry_after: end - now_ms; reset_after: end - now_ms when count > 0.
--
-- Guarantees: every limit is read and decided before the first write; any
-- number of concurrent callers never push a count past L in one window.
-- Like every fixed window, up to 2L can pass within w across a window end.
--
-- Example: limit 3 per 60000 ms, on a missing key at now = N us (N / 1000
-- = M ms): {1, N, 1, M + 60000}, the key holds "f60000x3:1"; three more
-- calls 2 ms later: the last gets {0, N + 2000, 3, M + 60000} (retry and
-- reset after 59998 ms).

local MAX = 9007199254740991

-- The checks of lib/rate, lib/args, lib/fixed and lib/tag, and lib/fail's
-- errors, written in place (see rate/gcra/check): no helper calls, no table
-- but the reply, whose slots 4i-1 .. 4i+2 keep limit i's count, window end,
-- w and L between the decision and the writes. Arguments convert by
-- arithmetic (tonumber parses a string twice): a non-numeric one raises
-- Lua's own error, still before any write, so the refusal stays definite.

local n = #KEYS
local adopt = #ARGV == 2 + 2 * n and ARGV[2 + 2 * n] == 'adopt'
if n < 1 or (#ARGV ~= 1 + 2 * n and not adopt) then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': expected 1 + 2 arguments per key, got '
    .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = ARGV[1] + 0
if cost % 1 ~= 0 or cost < 1 or cost > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad cost: ' .. ARGV[1])
end
local time = redis.call('TIME')
local micros = time[1] * 1000000 + time[2]
local now = math.floor(micros / 1000) -- exact: micros < 2^53 (lib/div)

-- A limit's end is stored as 0 when there is no window (missing key, or
-- ended by now), and negated when the counter was found without an expiry
-- and must be given one.
local reply, admitted = {0, micros, 0, 0, 0, 0}, 1
for i = 1, n do
  local w, l = ARGV[2 * i] + 0, ARGV[2 * i + 1] + 0
  if w % 1 ~= 0 or l % 1 ~= 0 or w < 1 or l < 1 or w > MAX or l > MAX then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad window or limit for key ' .. i)
  end
  if cost > l then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': cost is above the limit of key ' .. i)
  end
  -- The state: "<tag>:<count>" (at most 34 + 1 + 16 bytes) or a bare
  -- count, a canonical integer in [0, 2^53 - 1] (as lib/fixed reads it);
  -- missing, or past its end, is empty.
  local c, e = 0, 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    -- Its own tag costs one comparison of the prefix; another tag, or a
    -- bare count (written before tags), is looked at only then.
    local prefix = 'f' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'
    local len = #prefix
    local colon = false
    if string.sub(stored, 1, len) == prefix then
      stored = string.sub(stored, len + 1)
    else
      colon = #stored <= 51 and string.find(stored, ':', 1, true)
    end
    if colon then
      local by, tag = string.sub(stored, 1, colon - 1), string.sub(prefix, 1, len - 1)
      -- lib/tag's tag_same and tag_refuse. A prefix that is no tag is
      -- left in place: the value is then foreign data, refused below.
      if by == tag then
        stored = string.sub(stored, colon + 1)
      elseif string.find(by, '^[a-z]%d+x%d+$') or string.find(by, '^m%d+$') then
        if not (adopt and string.byte(by, 1) == 102) then -- 'f'
          return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
            .. ' holds state written by ' .. by .. ', not ' .. tag .. '; nothing was written')
        end
        stored = string.sub(stored, colon + 1)
      end
    end
    c = #stored <= 16 and (stored == '0' or string.find(stored, '^[1-9]%d*$')) and stored + 0
    if not c or c > MAX then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a counter')
    end
    e = redis.call('PEXPIRETIME', KEYS[i])
    if e == -1 then
      e = -(now + w)
    elseif now >= e then
      c, e = 0, 0
    end
  end
  -- Compared as cost > L - count so that no intermediate passes 2^53.
  if cost > l - c then admitted = 0 end
  local j = 4 * i - 1
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = c, e, w, l
end
reply[1] = admitted

-- Every write is the tagged count; the window (expiry) is set with it, or
-- kept. Numbers reach Redis as text formatted with %d (see
-- rate/gcra/check).
for i = 1, n do
  local j = 4 * i - 1
  local c, e, w = reply[j], reply[j + 1], reply[j + 2]
  if admitted == 1 then
    if e == 0 then
      c, e = cost, now + w
    elseif e < 0 then
      c, e = c + cost, -e
    else
      c = c + cost
    end
    local value = 'f' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'
    value = value .. string.format('%d', c)
    if e == reply[j + 1] then
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    else
      redis.call('SET', KEYS[i], value, 'PXAT', string.format('%d', e))
    end
  elseif e < 0 then
    e = -e
    redis.call('PEXPIREAT', KEYS[i], e)
  end
  reply[2 * i + 1], reply[2 * i + 2] = c, e
end
for k = 2 * n + 3, 4 * n + 2 do reply[k] = nil end
return reply
