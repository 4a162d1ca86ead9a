-- rate/sliding_window/check: take `cost` from one or more sliding windows, all or nothing.
--
-- The sliding-window counter most API gateways use: time is cut into
-- windows of w milliseconds aligned on the Unix epoch; a limit counts the
-- units admitted in the current window plus those of the previous window,
-- weighted by the share of the previous window still inside the last w ms:
--   estimate = previous x (w - e) / w + count      (e: ms since this window began)
-- A call fits when estimate + cost <= limit.
--
-- KEYS[i]     limit i: a hash {start, count, previous}
--               start     integer ms since the Unix epoch (server clock): the
--                         start of the window `count` belongs to, a multiple of w
--               count     units admitted in that window
--               previous  units admitted in the window before it
--             Missing means empty. It expires (PEXPIREAT) at start + 2w, when
--             neither count matters any more.
-- ARGV[1]     cost    integer, 1 <= cost <= every limit.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1.
-- ARGV[2i+1]  limit   L of limit i, integer >= 1, with L x w <= 2^53-1 (so
--                     the weighted sums below are exact integers).
--
-- Decision, with now = TIME in ms (rounded down), for each limit:
--   roll the state to the window holding now (a state two or more windows
--   old counts as empty; one the clock has stepped back from is kept as is)
--   fits = count + cost <= L  and  previous x (w - e) <= (L - count - cost) x w
-- When every limit fits, each stores count + cost; otherwise nothing is
-- written (a denied call consumes nothing, on any limit).
--
-- Reply: {admitted, now, then per limit: fits, remaining, retry_after, reset_after}
--   admitted     1 when every limit fitted and was charged; else 0
--   now          the server time of the decision, microseconds since the epoch
--   fits         1 when this limit on its own had room for cost
--   remaining    units that fit right now, after this call:
--                L - count - ceil(previous x (w - e) / w), never below 0
--   retry_after  milliseconds until cost fits on this limit if nothing else
--                arrives (the estimate only falls as time passes); -1 when it
--                fits now
--   reset_after  milliseconds until the estimate is 0: the end of the next
--                window when count > 0, of this one when only previous > 0
--
-- Guarantees: every limit is read and decided before the first write. In
-- each aligned window at most L units are admitted, and at each admission
-- the weighted estimate, this admission included, is at most L.
--
-- Example: limit 10 per 1000 ms; previous = 10, count = 0, e = 300: the
-- estimate is 7, so cost 3 fits and cost 4 waits until e = 400 (retry 100).

--@include lib/fail
--@include lib/rate

local MAX = 9007199254740991

-- The checks of lib/args and lib/window, written in place (see
-- rate/gcra/check): no helper calls, no table but the reply. Between the
-- decision and the writes, its slots 4i-1 .. 4i+1 keep limit i's start,
-- count and previous, and two slots past the answers its w and L (cleared
-- before the reply is sent).

local n, cost, micros = rate_begin()
if not n then return fail(cost) end
local floor, ceil = math.floor, math.ceil
local now = floor(micros / 1000) -- exact: micros < 2^53 (lib/div)

local reply, admitted, extra = {0, micros, 0, 0, 0, 0, 0, 0}, 1, 4 * n + 1
for i = 1, n do
  local w, l = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if not w or not l or w % 1 ~= 0 or l % 1 ~= 0 or w < 1 or l < 1 or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  -- The state: exactly the fields start, count and previous, canonical
  -- integers in [0, 2^53 - 1], rolled to the window holding now (as
  -- lib/window reads it); missing is an empty window.
  local cur, c, p = floor(now / w) * w, 0, 0
  local all = redis.call('HGETALL', KEYS[i])
  if #all > 0 then
    local s
    c, p = nil, nil
    if #all == 6 then
      for f = 1, 5, 2 do
        local raw = all[f + 1]
        local v = #raw <= 16 and (raw == '0' or string.find(raw, '^[1-9]%d*$')) and tonumber(raw)
        if v and v <= MAX then
          local name = all[f]
          if name == 'start' then s = v elseif name == 'count' then c = v elseif name == 'previous' then p = v end
        end
      end
    end
    if not (s and c and p) then
      return fail('key ' .. KEYS[i] .. ' does not hold a sliding window')
    end
    if s >= cur then cur = s -- this window, or the clock stepped back
    elseif s == cur - w then c, p = 0, c
    else c, p = 0, 0 end
  end
  -- A lowered limit: clamp so that the products below stay exact.
  if c > l then c = l end
  if p > l then p = l end
  local e = now - cur
  if e < 0 then e = 0 end
  if not (c + cost <= l and p * (w - e) <= (l - c - cost) * w) then admitted = 0 end
  local j = 4 * i - 1
  reply[j], reply[j + 1], reply[j + 2] = cur, c, p
  reply[extra + 2 * i], reply[extra + 2 * i + 1] = w, l
end
reply[1] = admitted

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2). Every
-- product and dividend below is at most L x w <= 2^53 - 1, so the divisions
-- are exact (lib/div).
for i = 1, n do
  local j = 4 * i - 1
  local cur, c, p = reply[j], reply[j + 1], reply[j + 2]
  local w, l = reply[extra + 2 * i], reply[extra + 2 * i + 1]
  local e = now - cur
  if e < 0 then e = 0 end
  local fits = c + cost <= l and p * (w - e) <= (l - c - cost) * w
  if admitted == 1 then
    c = c + cost
    redis.call('HSET', KEYS[i], 'start', cur, 'count', c, 'previous', p)
    redis.call('PEXPIREAT', KEYS[i], cur + 2 * w)
  end
  local remaining = l - c - ceil(p * (w - e) / w)
  if remaining < 0 then remaining = 0 end
  local retry, reset = -1, 0
  if not fits then
    -- Still in this window, once previous x (w - e') <= x x w; else in the
    -- next one, where previous = count and count = 0.
    local x = l - c - cost
    local e1 = w
    if x >= 0 and p > 0 then e1 = w - floor(x * w / p) end
    if e1 < w then
      retry = e1 - e
    elseif c == 0 then
      retry = w - e
    else
      local e2 = w - floor((l - cost) * w / c)
      if e2 < 0 then e2 = 0 end
      retry = w - e + e2
    end
  end
  if c > 0 then reset = cur + 2 * w - now elseif p > 0 then reset = cur + w - now end
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = fits and 1 or 0, remaining, retry, reset
end
for k = extra + 2, extra + 2 * n + 1 do reply[k] = nil end
return reply
