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
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/window

local MAX = 9007199254740991

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end
local window, limit = {}, {}
for i = 1, n do
  local w, l = arg_int(2 * i, 1, MAX), arg_int(2 * i + 1, 1, MAX)
  if not w or not l or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  window[i], limit[i] = w, l
end

local micros = now_us()
local now = floor_div(micros, 1000)

-- Milliseconds from e (in the current window) until cost fits, when it does not now.
local function retry_ms(c, p, e, w, l)
  local x = l - c - cost
  if x >= 0 and p > 0 then
    -- Still in this window, once previous x (w - e') <= x x w.
    local e1 = w - floor_div(x * w, p)
    if e1 < w then return e1 - e end
  end
  -- In the next window, where previous = c and count = 0.
  if c == 0 then return w - e end
  local e2 = math.max(0, w - floor_div((l - cost) * w, c))
  return w - e + e2
end

local start, count, previous, elapsed, fits, admitted = {}, {}, {}, {}, {}, 1
for i = 1, n do
  local w, l = window[i], limit[i]
  local cur, c, p = window_read(KEYS[i], now, w)
  if not cur then return fail('key ' .. KEYS[i] .. ' does not hold a sliding window') end
  -- A lowered limit: clamp so that the products below stay exact.
  c, p = math.min(c, l), math.min(p, l)
  local e = math.max(0, now - cur)
  start[i], count[i], previous[i], elapsed[i] = cur, c, p, e
  fits[i] = c + cost <= l and p * (w - e) <= (l - c - cost) * w
  if not fits[i] then admitted = 0 end
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {admitted, micros}
for i = 1, n do
  local w, l, cur, c, p, e = window[i], limit[i], start[i], count[i], previous[i], elapsed[i]
  if admitted == 1 then
    c = c + cost
    redis.call('HSET', KEYS[i], 'start', cur, 'count', c, 'previous', p)
    redis.call('PEXPIREAT', KEYS[i], cur + 2 * w)
  end
  local remaining = math.max(0, l - c - ceil_div(p * (w - e), w))
  local retry, reset = -1, 0
  if not fits[i] then retry = retry_ms(c, p, e, w, l) end
  if c > 0 then reset = cur + 2 * w - now elseif p > 0 then reset = cur + w - now end
  reply[#reply + 1] = fits[i] and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
