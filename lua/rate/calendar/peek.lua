#!lua flags=no-writes
-- rate/calendar/peek: what rate/calendar/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/calendar/check (state "k<h>x<L>:<count>"
-- expiring at its period's end; ARGV[1] cost, then h, L and four
-- boundaries per key, then optionally "adopt").
--
-- Reply: {admitted, now, then per limit: count, end} as rate/calendar/check,
-- except that nothing is charged: admitted says whether check would admit,
-- and count is the count now. A state check would refuse (lib/tag) is
-- refused the same way, with NOLOCK_STATE; a server time outside the
-- periods sent, where no period is stored, with NOLOCK_PERIOD.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: limit 3, count 3, period ending at E: peeking cost 1 gives
-- {0, now, 3, E} (retry and reset at E).

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/fixed
--@include lib/tag
--@include lib/calendar

local MAX = 9007199254740991

local n = #KEYS
local adopt = n >= 1 and tag_adopt(1 + 6 * n)
if n < 1 or adopt == nil then
  return fail('expected 1 + 6 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local micros = now_us()
local now = math.floor(micros / 1000)

local reply, admitted = {0, micros}, 1
for i = 1, n do
  local h, l, b = calendar_args(6 * i - 4)
  if not h then return fail('bad period or limit for key ' .. i) end
  if cost > l then return fail('cost is above the limit of key ' .. i) end
  local tag = string.format('k%dx%d', h, l)
  local c, e = fixed_read(KEYS[i], now, tag, adopt, true)
  if not c then
    if e then return tag_refuse(KEYS[i], e, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a counter')
  end
  if not e or e == -1 then
    e = calendar_end(b, now)
    if not e then return calendar_refuse(KEYS[i], now) end
  elseif e > b[2] and (e == b[3] or e == b[4]) then
    -- A later period stored (the clock stepped back): full until the
    -- server's own period ends, as rate/calendar/check answers.
    local pe = calendar_end(b, now)
    if pe and e > pe then c, e = l, pe end
  end
  if cost > l - c then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = c, e
end
reply[1] = admitted
return reply
