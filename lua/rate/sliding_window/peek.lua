#!lua flags=no-writes
-- rate/sliding_window/peek: what rate/sliding_window/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/sliding_window/check (state: the string
-- "s<w>x<L>:<start>:<count>:<previous>", or a hash {start, count, previous[,
-- by]} of the forms before (lib/window); ARGV[1]
-- cost, then window w in ms and limit L per key, then optionally "adopt").
-- A limit tagged by another limit is refused as check refuses it
-- (NOLOCK_STATE; with "adopt", any sliding window's state is read as it
-- is); one of an older form is read as it is and stays so (peek writes
-- nothing).
--
-- Reply: {admitted, now, then per limit: start, count, previous} as
--   rate/sliding_window/check, except that nothing is charged: admitted
--   says whether check would admit, and the state is the one now.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: limit 10 per 1000 ms; previous = 10, count = 0, e = 300: peeking
-- cost 4 gives {0, now, start, 0, 10} (3 fit, retry after 100 ms, empty
-- in 700 ms).

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/tag
--@include lib/window

local MAX = 9007199254740991

local n = #KEYS
local adopt = tag_adopt(1 + 2 * n)
if n < 1 or adopt == nil then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local micros = now_us()
local now = floor_div(micros, 1000)

local reply, admitted = {0, micros}, 1
for i = 1, n do
  local w, l = arg_int(2 * i, 1, MAX), arg_int(2 * i + 1, 1, MAX)
  if not w or not l or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  local tag = 's' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1]
  local cur, c, p = window_read(KEYS[i], now, w, tag, adopt)
  if not cur then
    if c then return tag_refuse(KEYS[i], c, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a sliding window')
  end
  -- Counts above the limit (a lowered limit, or a debt) decide as the
  -- limit, and are returned as stored.
  local e = math.max(0, now - cur)
  if not (c + cost <= l and math.min(p, l) * (w - e) <= (l - c - cost) * w) then admitted = 0 end
  reply[3 * i], reply[3 * i + 1], reply[3 * i + 2] = cur, c, p
end
reply[1] = admitted
return reply
