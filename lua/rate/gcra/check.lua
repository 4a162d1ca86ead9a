-- rate/gcra/check: take `cost` units from one or more GCRA limits, all or nothing.
--
-- GCRA (generic cell rate algorithm) keeps one number per limit: the
-- theoretical arrival time TAT, the instant at which the limiter is full
-- again if nothing more arrives. Each unit of cost pushes TAT one emission
-- interval T further; a call fits while TAT stays within burst x T of now.
-- (It is a token bucket written as one timestamp: the tokens left are
-- floor((now + burst x T - TAT) / T).)
--
-- KEYS[i]     limit i: a string "g<T>x<b>:<TAT>": the limit's tag (lib/tag:
--             which limit wrote it) and TAT, integer microseconds since the
--             Unix epoch by the server clock. Missing, or in the past, means
--             full. It expires (PXAT) at TAT rounded up to the millisecond:
--             an idle limiter costs no memory. A bare TAT (written before
--             tags) is read and tagged at the next admission.
-- ARGV[1]     cost      integer, 1 <= cost <= every burst: units to take.
-- ARGV[2i]    interval  T of limit i, integer microseconds >= 1: period / rate
--                       (rounded up by the caller).
-- ARGV[2i+1]  burst     b of limit i, integer >= 1, with b x T <= 2^51.
-- ARGV[2n+2]  optional: "adopt" (lib/tag): a state of other GCRA numbers is
--             read as it is (a declared change of a stored configuration)
--             and retagged with these at the admission's write.
--
-- A state tagged by another limit (other numbers, or another algorithm) is
-- refused before any write: NOLOCK_STATE, naming the key and both tags.
--
-- Decision, with now = TIME in microseconds, for each limit:
--   tat  = max(TAT, now)
--   fits = (tat - now) + cost x T <= b x T
-- When every limit fits, each stores TAT' = tat + cost x T; otherwise
-- nothing is written (a denied call consumes nothing, on any limit).
--
-- Reply: {admitted, now, then per limit: tat} -- the raw state; the
-- client derives every answer from it (src/rate/state.rs), so the server
-- spends nothing on arithmetic no decision needs.
--   admitted  1 when every limit fitted and was charged; else 0
--   now       the server time of the decision, microseconds since the epoch
--   tat       limit i's TAT after the call: max(TAT, now), plus cost x T
--             when admitted. From it and the quota: fits (when denied:
--             (tat - now) + cost x T <= b x T), remaining (floor((b x T -
--             (tat - now)) / T), never below 0), retry_after and
--             reset_after (ceil((tat - now) / 1000) ms).
--
-- Guarantees: every limit is read and decided before the first write, so the
-- call is all or nothing even across several keys. Any number of concurrent
-- callers never get more than b + floor(d / T) units in d microseconds.
--
-- Example: 10 per second, burst 10 (T = 100000, b = 10), on a missing key at
-- now = N: {1, N, N + 100000} (9 remaining). Ten quick calls leave TAT at
-- N + 1000000; an eleventh at N + 2000 gets {0, N + 2000, N + 1000000}
-- (0 remaining, retry after 98 ms, full again after 998 ms).

local MAX_FILL = 2251799813685248 -- 2^51 microseconds, about 71 years

-- The checks of lib/rate, lib/args, lib/stored, lib/gcra and lib/tag, and
-- lib/fail's errors, written in place: on a hot key the server's time per
-- call is the ceiling, and a helper costs a closure and a call per check.
-- No table is built but the reply, whose slot i + 2 holds limit i's TAT;
-- T and b are read again from ARGV for a write.

local n = #KEYS
local adopt = #ARGV == 2 + 2 * n and ARGV[2 + 2 * n] == 'adopt'
if n < 1 or (#ARGV ~= 1 + 2 * n and not adopt) then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': expected 1 + 2 arguments per key, got '
    .. #ARGV .. ' for ' .. n .. ' keys')
end
-- Arguments convert by arithmetic (tonumber parses a string twice): a
-- non-numeric one raises Lua's own error, still before any write, so the
-- refusal stays definite; only its wording is Lua's.
local cost = ARGV[1] + 0
if cost % 1 ~= 0 or cost < 1 or cost > 9007199254740991 then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad cost: ' .. tostring(ARGV[1]))
end
local time = redis.call('TIME')
-- TIME's digits convert in the arithmetic itself: no tonumber calls.
local now = time[1] * 1000000 + time[2]

-- Decide every limit before any write. The reply is built at its size for
-- one limit ({admitted, now, tat}); more limits grow it.
local reply, admitted = {0, now, now}, 1
for i = 1, n do
  local step, b = ARGV[2 * i] + 0, ARGV[2 * i + 1] + 0
  if step % 1 ~= 0 or b % 1 ~= 0 or step < 1 or b < 1
    or b * step > MAX_FILL or cost > b then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME
      .. ': bad interval or burst, or cost above the burst, for key ' .. i)
  end
  local tat = now
  local stored = redis.call('GET', KEYS[i])
  if stored then
    -- "<tag>:<TAT>" (lib/tag): its own tag costs one comparison of the
    -- prefix; another tag, or a bare TAT (written before tags), is looked
    -- at only then.
    local tag = 'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'
    local len = #tag
    if string.sub(stored, 1, len) == tag then
      stored = string.sub(stored, len + 1)
    else
      local at = string.find(stored, ':', 1, true)
      if at then
        local by = string.sub(stored, 1, at - 1)
        if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
          return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
            .. ' does not hold a GCRA state')
        end
        -- lib/tag's tag_same and tag_refuse, in place (no closures per call).
        if not adopt or string.byte(by) ~= 103 then -- 'g'
          return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
            .. ' holds state written by ' .. by .. ', not ' .. string.sub(tag, 1, len - 1)
            .. '; nothing was written')
        end
        stored = string.sub(stored, at + 1)
      end
    end
    -- A canonical integer (no sign, no leading zero, at most 16 digits)
    -- no later than now + 2^51, as this script writes it.
    -- Converted by arithmetic once its digits are checked: tonumber would
    -- parse the string twice.
    local v = #stored <= 16 and (stored == '0' or string.find(stored, '^[1-9]%d*$')) and stored + 0
    if not v or v > now + MAX_FILL then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a GCRA state')
    end
    if v > now then tat = v end
  end
  if (tat - now) + cost * step > b * step then admitted = 0 end
  reply[i + 2] = tat
end
reply[1] = admitted

-- Numbers reach Redis as text formatted with %d: Lua's own
-- number-to-string keeps 14 digits (a TAT has 16), and a number argument
-- is converted by the server with %.17g, which costs more than the rest of
-- the write (2.8 k instructions each on Redis 7.0). A TAT is at most now +
-- 2^52, so the expiry's quotient is exact (see lib/div).
if admitted == 1 then
  for i = 1, n do
    local t = reply[i + 2] + cost * ARGV[2 * i]
    redis.call('SET', KEYS[i], 'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':' .. string.format('%d', t),
      'PXAT', string.format('%d', math.ceil(t / 1000)))
    reply[i + 2] = t
  end
end
return reply
