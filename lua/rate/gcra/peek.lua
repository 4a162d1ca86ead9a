#!lua flags=no-writes
-- rate/gcra/peek: what rate/gcra/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/gcra/check (state: "<tag>:<TAT>", TAT in
-- integer microseconds since the Unix epoch; ARGV[1] cost, then interval T
-- and burst b per key, then optionally "adopt"). A state another limit
-- wrote is refused as check refuses it (NOLOCK_STATE).
--
-- Reply: {admitted, now, then per limit: tat} as rate/gcra/check, except
--   that nothing is charged: admitted says whether check would admit, and
--   tat is max(TAT, now), from which the client counts the units that fit
--   now, before any charge.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: 10 per second, burst 10, after 3 quick admissions at N, peeking
-- cost 1 at N + 1000: {1, N + 1000, N + 300000} (7 fit; full in 299 ms).

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/gcra

-- As rate/gcra/check decides, without the charge.

local n = #KEYS
-- A trailing "adopt" (lib/tag's tag_adopt, in place).
local adopt = #ARGV == 2 + 2 * n and ARGV[2 + 2 * n] == 'adopt'
if n < 1 or (#ARGV ~= 1 + 2 * n and not adopt) then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, 9007199254740991)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local now = now_us()

local reply, admitted = {0, now}, 1
for i = 1, n do
  local step, b = gcra_limit(i, cost)
  if not step then return fail('bad interval or burst, or cost above the burst, for key ' .. i) end
  local t, refused = gcra_tat(KEYS[i], now, 'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1], adopt)
  if not t then return refused end
  if (t - now) + cost * step > b * step then admitted = 0 end
  reply[i + 2] = t
end
reply[1] = admitted
return reply
