#!lua flags=no-writes
-- rate/fixed_window/peek: what rate/fixed_window/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/fixed_window/check (state: an integer
-- counter whose expiry is its window's end; ARGV[1] cost, then window w in ms
-- and limit L per key).
--
-- Reply: {admitted, now, then per limit: count, end} as
--   rate/fixed_window/check, except that nothing is charged: admitted says
--   whether check would admit, and count is the count now. A counter
--   without an expiry is reported as if its window ended at now + w.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: limit 3, count 3, window ending 1200 ms from now: peeking cost 1
-- gives {0, now, 3, now_ms + 1200} (retry and reset after 1200 ms).

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/fixed

local MAX = 9007199254740991

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local micros = now_us()
local now = math.floor(micros / 1000)

local reply, admitted = {0, micros}, 1
for i = 1, n do
  local w, l = arg_int(2 * i, 1, MAX), arg_int(2 * i + 1, 1, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  local c, e = fixed_read(KEYS[i], now)
  if not c then return fail('key ' .. KEYS[i] .. ' does not hold a counter') end
  if e == -1 then e = now + w end
  if cost > l - c then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = c, e or 0
end
reply[1] = admitted
return reply
