#!lua flags=no-writes
-- rate/fixed_window/peek: what rate/fixed_window/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/fixed_window/check (state: an integer
-- counter whose TTL is the rest of the window; ARGV[1] cost, then window w in
-- ms and limit L per key).
--
-- Reply: {admitted, now, then per limit: fits, remaining, retry_after, reset_after}
--   as rate/fixed_window/check, except that nothing is charged: admitted
--   says whether check would admit, and remaining is L - count now. A
--   counter without an expiry is reported as if its window were w.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: limit 3, count 3 with PTTL 1200: peeking cost 1 gives
-- {0, now, 0, 0, 1201, 1201}.

local MAX = 9007199254740991

local function fail(msg)
  return redis.error_reply('ERR nolock rate/fixed_window/peek: ' .. msg)
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

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local reply, admitted = {0, now}, 1
for i = 1, n do
  local w, l = int(2 * i, 1, MAX), int(2 * i + 1, 1, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  local c = 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    c = tonumber(stored)
    if c == nil or c ~= math.floor(c) or c < 0 then
      return fail('key ' .. i .. ' does not hold a counter')
    end
  end
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl == -1 then ttl = w end
  local fits = cost <= l - c
  local retry, reset = -1, 0
  if not fits then
    admitted = 0
    retry = ttl + 1
  end
  if c > 0 then reset = ttl + 1 end
  reply[#reply + 1] = fits and 1 or 0
  reply[#reply + 1] = math.max(0, l - c)
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
reply[1] = admitted
return reply
