#!lua flags=no-writes
-- rate/fixed_window/peek: what rate/fixed_window/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/fixed_window/check (state: the tagged
-- count "f<w>x<L>:<count>", or a bare count written before tags, whose
-- expiry is its window's end; ARGV[1] cost, then window w in ms and limit
-- L per key, then optionally "adopt").
--
-- Reply: {admitted, now, then per limit: count, end} as
--   rate/fixed_window/check, except that nothing is charged: admitted says
--   whether check would admit, and count is the count now. A counter
--   without an expiry is reported as if its window ended at now + w.
--
-- A state check would refuse (lib/tag: other numbers without "adopt",
-- another limit's state) is refused the same way, with NOLOCK_STATE.
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
--@include lib/tag

local MAX = 9007199254740991

local n = #KEYS
local adopt = n >= 1 and tag_adopt(1 + 2 * n)
if n < 1 or adopt == nil then
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
  local tag = string.format('f%dx%d', w, l)
  local c, e = fixed_read(KEYS[i], now, tag, adopt)
  if not c then
    if e then return tag_refuse(KEYS[i], e, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a counter')
  end
  if e == -1 then e = now + w end
  if cost > l - c then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = c, e or 0
end
reply[1] = admitted
return reply
