-- rate/sliding_window/check: take `cost` from one or more sliding windows, all or nothing.
--
-- The sliding-window counter most API gateways use: time is cut into
-- windows of w milliseconds aligned on the Unix epoch; a limit counts the
-- units admitted in the current window plus those of the previous window,
-- weighted by the share of the previous window still inside the last w ms:
--   estimate = previous x (w - e) / w + count      (e: ms since this window began)
-- A call fits when estimate + cost <= limit.
--
-- KEYS[i]     limit i: a hash {start, count, previous, by}
--               start     integer ms since the Unix epoch (server clock): the
--                         start of the window `count` belongs to, a multiple of w
--               count     units admitted in that window
--               previous  units admitted in the window before it
--               by        the tag of the limit that wrote it (lib/tag):
--                         "s<w>x<L>", its two numbers as ARGV sends them
--             Missing means empty. It expires (PEXPIREAT) at start + 2w, when
--             neither count matters any more. A hash of exactly {start,
--             count, previous} (written before tags) is read the same way
--             and tagged by its next admitted call.
-- ARGV[1]     cost    integer, 1 <= cost <= every limit.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1.
-- ARGV[2i+1]  limit   L of limit i, integer >= 1, with L x w <= 2^53-1 (so
--                     the weighted sums below are exact integers).
-- ARGV[2n+2]  optional: "adopt" (lib/tag): a limit tagged with other
--             numbers ("s..." still) is read as it is and retagged with
--             this call's when admitted, instead of refused.
--
-- Decision, with now = TIME in ms (rounded down), for each limit:
--   roll the state to the window holding now (a state two or more windows
--   old counts as empty; one the clock has stepped back from is kept as is)
--   fits = count + cost <= L  and  previous x (w - e) <= (L - count - cost) x w
-- When every limit fits, each stores count + cost and this call's tag;
-- otherwise nothing is written (a denied call consumes nothing, on any
-- limit, and tags nothing). A limit tagged by another limit (other
-- numbers, unless adopting; another algorithm, as a token bucket's hash)
-- is refused with NOLOCK_STATE, nothing written on any limit.
--
-- Reply: {admitted, now, then per limit: start, count, previous} -- the
-- raw state, rolled to now, counts as stored (the client weighs them as at
-- most L, as this script decides), from which the client
-- derives every answer (src/rate/state.rs):
--   admitted  1 when every limit fitted and was charged; else 0
--   now       the server time of the decision, microseconds since the epoch
--   start     the current window's start, ms (e = now_ms - start, at least 0)
--   count     units in it, after the call
--   previous  units in the window before
-- fits (when denied): count + cost <= L and previous x (w - e) <= (L -
-- count - cost) x w; remaining: L - count - ceil(previous x (w - e) / w),
-- never below 0; retry_after: when the estimate leaves room for cost (the
-- estimate only falls as time passes); reset_after: when the estimate is 0,
-- the end of the next window when count > 0, of this one when only
-- previous > 0.
--
-- Guarantees: every limit is read, its tag compared and decided before
-- the first write. In
-- each aligned window at most L units are admitted, and at each admission
-- the weighted estimate, this admission included, is at most L.
--
-- Example: limit 10 per 1000 ms; previous = 10, count = 0, e = 300: the
-- estimate is 7, so cost 3 fits ({1, now, start, 3, 10}) and cost 4 waits
-- until e = 400 ({0, now, start, 0, 10}: retry after 100 ms). The state
-- is then {start, count = 3, previous = 10, by = "s1000x10"}; a check of
-- limit 20 per 1000 ms on it is refused ("... holds state written by
-- s1000x10, not s1000x20 ...").

local MAX = 9007199254740991

-- The checks of lib/rate, lib/args, lib/window and lib/tag, and lib/fail's
-- errors, written in place (see rate/gcra/check): no helper calls, no table
-- but the reply, and `retag` (as rate/token_bucket/check's) only when a
-- limit's stored tag is not this call's.

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
if cost % 1 ~= 0 or cost < 1 or cost > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad cost: ' .. tostring(ARGV[1]))
end
local time = redis.call('TIME')
local micros = time[1] * 1000000 + time[2]
local floor = math.floor
local now = floor(micros / 1000) -- exact: micros < 2^53 (lib/div)

-- Slots 3i, 3i + 1, 3i + 2 of the reply hold limit i's start, count and
-- previous.
local reply, admitted, retag = {0, micros, 0, 0, 0}, 1, nil
for i = 1, n do
  local w, l = ARGV[2 * i] + 0, ARGV[2 * i + 1] + 0
  if w % 1 ~= 0 or l % 1 ~= 0 or w < 1 or l < 1 or l * w > MAX then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad window or limit for key ' .. i)
  end
  if cost > l then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': cost is above the limit of key ' .. i)
  end
  -- The state: exactly the fields start, count, previous and by, or the
  -- first three alone (before tags), canonical integers in [0, 2^53 - 1],
  -- rolled to the window holding now (as lib/window reads it); missing is
  -- an empty window. A value is converted by arithmetic once its digits
  -- are checked (tonumber parses twice).
  local cur, c, p = floor(now / w) * w, 0, 0
  local tag = 's' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1]
  local all = redis.call('HGETALL', KEYS[i])
  if #all > 0 then
    local s, by
    c, p = nil, nil
    for f = 1, #all, 2 do
      local name, raw = all[f], all[f + 1]
      if name == 'by' then
        by = raw
      elseif name == 'start' or name == 'count' or name == 'previous' then
        local v = #raw <= 16 and (raw == '0' or string.find(raw, '^[1-9]%d*$')) and raw + 0
        if v and v <= MAX then
          if name == 'start' then s = v elseif name == 'count' then c = v else p = v end
        end
      end
    end
    -- Another limit's tag is refused (lib/tag's tag_same and tag_refuse):
    -- adopting reads any sliding window's ('s' is byte 115).
    if by ~= tag then
      if by and not (adopt and string.byte(by) == 115) then
        return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
          .. ' holds state written by ' .. by .. ', not ' .. tag .. '; nothing was written')
      end
      retag = retag or {}
      retag[i] = true
    end
    if not (s and c and p) or #all ~= (by and 8 or 6) then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a sliding window')
    end
    if s >= cur then cur = s -- this window, or the clock stepped back
    elseif s == cur - w then c, p = 0, c
    else c, p = 0, 0 end
  else
    retag = retag or {}
    retag[i] = true
  end
  -- Counts above the limit (a lowered limit, or a debt) decide as the
  -- limit, so that the products below stay exact; they are returned as
  -- stored, so the client sees a debt.
  local e = now - cur
  if e < 0 then e = 0 end
  if c + cost > l then
    admitted = 0
  elseif (p < l and p or l) * (w - e) > (l - c - cost) * w then
    admitted = 0
  end
  reply[3 * i], reply[3 * i + 1], reply[3 * i + 2] = cur, c, p
end
reply[1] = admitted

-- A limit whose tag is this call's keeps it; any other (new, from before
-- tags, or adopted) is given this call's.
if admitted == 1 then
  for i = 1, n do
    local cur, c, p = reply[3 * i], reply[3 * i + 1] + cost, reply[3 * i + 2]
    local w = ARGV[2 * i]
    if retag and retag[i] then
      redis.call('HSET', KEYS[i], 'start', cur, 'count', c, 'previous', p,
        'by', 's' .. w .. 'x' .. ARGV[2 * i + 1])
    else
      redis.call('HSET', KEYS[i], 'start', cur, 'count', c, 'previous', p)
    end
    redis.call('PEXPIREAT', KEYS[i], cur + 2 * w)
    reply[3 * i + 1] = c
  end
end
return reply
