-- rate/fixed_window/check: take `cost` from one or more fixed windows, all or nothing.
--
-- The bounded counter with a window (as limits/try_increment): a limit is a
-- counter whose expiry is the end of its window. The first admission opens
-- the window (sets the expiry); when the key expires, counting starts again
-- from zero. Windows start when a limiter is first used, not on the clock,
-- so the windows of different users do not all reset at the same instant.
--
-- KEYS[i]     limit i: a string holding an integer, the units admitted in the
--             current window; its TTL is the rest of the window. Missing
--             means empty.
-- ARGV[1]     cost    integer, 1 <= cost <= every limit.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1: set as the
--                     key's expiry when an admission opens the window.
-- ARGV[2i+1]  limit   L of limit i, integer >= 1.
--
-- Decision, for each limit: fits = count + cost <= L. When every limit fits,
-- each adds cost; otherwise nothing is counted (a denied call consumes
-- nothing, on any limit). A counter found without an expiry (written by
-- something else) is given one of w, so that it cannot block forever.
--
-- Reply: {admitted, now, then per limit: fits, remaining, retry_after, reset_after}
--   admitted     1 when every limit fitted and was charged; else 0
--   now          the server time of the decision, microseconds since the epoch
--   fits         1 when this limit on its own had room for cost
--   remaining    L - count after this call, never below 0
--   retry_after  milliseconds until the window ends (then cost fits); -1
--                when it fits now
--   reset_after  milliseconds until the window ends; 0 when the count is 0
--   Both are PTTL + 1: Redis keeps a key through the millisecond its expiry
--   names, and drops it from the next one on.
--
-- Guarantees: every limit is read and decided before the first write; any
-- number of concurrent callers never push a count past L in one window.
-- Like every fixed window, up to 2L can pass within w across a window end.
--
-- Example: limit 3 per 60000 ms, on a missing key at now = N:
-- {1, N, 1, 2, -1, 60001}; after three more quick calls {0, N', 0, 0, 59999, 59999}.

local MAX = 9007199254740991

local function fail(msg)
  return redis.error_reply('ERR nolock rate/fixed_window/check: ' .. msg)
end

local function int(i, min, max)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < min or v > max then return nil end
  return v
end

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end
local window, limit = {}, {}
for i = 1, n do
  local w, l = int(2 * i, 1, MAX), int(2 * i + 1, 1, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  window[i], limit[i] = w, l
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local count, pttl, fits, admitted = {}, {}, {}, 1
for i = 1, n do
  local c = 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    c = tonumber(stored)
    if c == nil or c ~= math.floor(c) or c < 0 then
      return fail('key ' .. i .. ' does not hold a counter')
    end
  end
  count[i], pttl[i] = c, redis.call('PTTL', KEYS[i])
  -- Compared as cost > L - count so that no intermediate passes 2^53.
  fits[i] = cost <= limit[i] - c
  if not fits[i] then admitted = 0 end
end

local reply = {admitted, now}
for i = 1, n do
  local c, ttl = count[i], pttl[i]
  if admitted == 1 then
    c = redis.call('INCRBY', KEYS[i], cost)
  end
  if (admitted == 1 and ttl < 0) or ttl == -1 then
    redis.call('PEXPIRE', KEYS[i], window[i])
    ttl = window[i]
  end
  local retry, reset = -1, 0
  if not fits[i] then retry = ttl + 1 end
  if c > 0 then reset = ttl + 1 end
  reply[#reply + 1] = fits[i] and 1 or 0
  reply[#reply + 1] = math.max(0, limit[i] - c)
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
