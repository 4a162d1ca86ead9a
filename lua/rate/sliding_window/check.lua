-- rate/sliding_window/check: take `cost` from one or more sliding windows, all or nothing.
--
-- The sliding-window counter most API gateways use: time is cut into
-- windows of w milliseconds aligned on the Unix epoch; a limit counts the
-- units admitted in the current window plus those of the previous window,
-- weighted by the share of the previous window still inside the last w ms:
--   estimate = previous x (w - e) / w + count      (e: ms since this window began)
-- A call fits when estimate + cost <= limit.
--
-- KEYS[i]     limit i: the string "s<w>x<L>:<start>:<count>:<previous>"
--             (lib/window)
--               s<w>x<L>  the tag of the limit that wrote it (lib/tag), its
--                         two numbers as ARGV sends them
--               start     integer ms since the Unix epoch (server clock): the
--                         start of the window `count` belongs to, a multiple of w
--               count     units admitted in that window
--               previous  units admitted in the window before it
--             Missing means empty. It expires (PXAT) at start + 2w, when
--             neither count matters any more. A hash {start, count,
--             previous, by} or {start, count, previous} (the forms before)
--             is read the same way and replaced by the string at its next
--             admitted call.
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
-- numbers, unless adopting; another algorithm, as a token bucket's state)
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
-- is then "s1000x10:<start>:3:10"; a check of
-- limit 20 per 1000 ms on it is refused ("... holds state written by
-- s1000x10, not s1000x20 ...").

local MAX = 9007199254740991

-- The checks of lib/rate, lib/args, lib/window and lib/tag, and lib/fail's
-- errors, written in place (see rate/gcra/check): no helper calls, no table
-- but the reply.

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
local reply, admitted = {0, micros, 0, 0, 0}, 1
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
  -- The state (lib/window, lib/state): "<tag>:<start>:<count>:<previous>",
  -- canonical integers in [0, 2^53 - 1]; missing is an empty window. Its
  -- own tag costs one comparison of the prefix; another tag, or a hash of
  -- the form before, is looked at only then. A value is converted by
  -- arithmetic once its digits are checked (tonumber parses twice).
  local cur, c, p = floor(now / w) * w, 0, 0
  local prefix = 's' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'
  local stored = redis.pcall('GET', KEYS[i])
  if stored then
    local len, ss, cs, ps = #prefix, nil, nil, nil
    if type(stored) == 'table' then
      -- WRONGTYPE: a hash {start, count, previous[, by]} (lib/state), read
      -- only here.
      local all, by = redis.call('HGETALL', KEYS[i]), nil
      for f = 1, #all, 2 do
        local name = all[f]
        if name == 'by' then by = all[f + 1]
        elseif name == 'start' then ss = all[f + 1]
        elseif name == 'count' then cs = all[f + 1]
        elseif name == 'previous' then ps = all[f + 1] end
      end
      if by and by .. ':' ~= prefix and not (adopt and string.byte(by) == 115) then
        return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
          .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
          .. '; nothing was written')
      end
      if #all ~= (by and 8 or 6) or not (ss and cs and ps and string.find(ss, '^%d+$')
        and string.find(cs, '^%d+$') and string.find(ps, '^%d+$')) then ss = nil end
    elseif string.sub(stored, 1, len) == prefix then
      ss, cs, ps = string.match(stored, '^(%d+):(%d+):(%d+)$', len + 1)
    else
      local at = string.find(stored, ':', 1, true)
      local by = at and string.sub(stored, 1, at - 1)
      if not by or not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
        return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
          .. ' does not hold a sliding window')
      end
      -- lib/tag's tag_same and tag_refuse: adopting reads any sliding
      -- window's ('s' is byte 115).
      if not adopt or string.byte(by) ~= 115 then
        return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
          .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
          .. '; nothing was written')
      end
      ss, cs, ps = string.match(stored, '^(%d+):(%d+):(%d+)$', at + 1)
    end
    -- Canonical: at most 16 digits, no leading zero (a number of n digits
    -- is at least 10^(n-1)), at most 2^53 - 1.
    local s = ss and #ss <= 16 and #cs <= 16 and #ps <= 16 and ss + 0
    c, p = s and cs + 0, s and ps + 0
    if not s or s > MAX or c > MAX or p > MAX or (#ss > 1 and s < 10 ^ (#ss - 1))
      or (#cs > 1 and c < 10 ^ (#cs - 1)) or (#ps > 1 and p < 10 ^ (#ps - 1)) then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a sliding window')
    end
    if s >= cur then cur = s -- this window, or the clock stepped back
    elseif s == cur - w then c, p = 0, c
    else c, p = 0, 0 end
  end
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

-- Every admitted limit is written whole with this call's tag (a hash of
-- the older form, or another tag adopted, is replaced), its numbers as
-- text formatted with %d (see rate/gcra/check).
if admitted == 1 then
  for i = 1, n do
    local cur, c, p = reply[3 * i], reply[3 * i + 1] + cost, reply[3 * i + 2]
    local w = ARGV[2 * i]
    redis.call('SET', KEYS[i], 's' .. w .. 'x' .. ARGV[2 * i + 1] .. string.format(':%d:%d:%d', cur, c, p),
      'PXAT', string.format('%d', cur + 2 * w))
    reply[3 * i + 1] = c
  end
end
return reply
