-- rate/gcra/check_at_most: take as many units as fit, up to `max`, from one GCRA limit.
--
-- go-redis/redis_rate's AllowAtMost: instead of all-or-nothing, grant
-- min(max, available) units now and charge exactly those. A caller that
-- drains a queue asks for up to 100 and processes what it was granted.
--
-- KEYS[1]   the limit: a string holding TAT, integer microseconds since the
--           Unix epoch by the server clock, exactly as rate/gcra/check writes
--           it (the two scripts share the key). Missing, or in the past,
--           means full. Anything else is an error, with nothing written.
-- ARGV[1]   max       integer, 1 <= max <= 2^53 - 1: the most units wanted
--                     (may exceed the burst; at most the burst is granted).
-- ARGV[2]   interval  T, integer microseconds >= 1: period / rate (rounded up).
-- ARGV[3]   burst     b, integer >= 1, with b x T <= 2^51.
--
-- Decision, with now = TIME in microseconds:
--   tat       = max(TAT, now)
--   available = floor((b x T - (tat - now)) / T), never below 0
--   granted   = min(max, available)
-- When granted > 0, TAT' = tat + granted x T is stored (PXAT TAT' in ms,
-- rounded up); when granted = 0 nothing is written.
--
-- Reply: {granted, now, tat}, the raw state as rate/gcra/check returns it
--   granted      units taken by this call, 0 <= granted <= max
--   now          the server time of the decision, microseconds since the epoch
--   tat          the TAT after the call, at least now (microseconds)
-- The client derives remaining (floor((b x T - (tat - now)) / T), never
-- below 0), retry_after when nothing was granted, reset_after and a debt
-- left by settlements (tat - now beyond b x T), as for a check of 1 unit.
--
-- Guarantees: the same bound as rate/gcra/check: at most b + floor(d / T)
-- units are granted in any span of d, whatever mix of the two scripts runs.
--
-- Example: 10 per second, burst 10 (T = 100000, b = 10), 7 units left at N
-- (TAT = N + 300000): max 20 -> {7, N, N + 1000000}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/gcra

local MAX = 9007199254740991      -- 2^53 - 1: Lua numbers are doubles
local MAX_FILL = 2251799813685248 -- 2^51 microseconds, about 71 years

-- A trailing "adopt" (lib/tag's tag_adopt, in place).
local adopt = #ARGV == 4 and ARGV[4] == 'adopt'
if #KEYS ~= 1 or (#ARGV ~= 3 and not adopt) then
  return fail('expected 1 key and 3 arguments, got ' .. #KEYS .. ' and ' .. #ARGV)
end
local max = arg_int(1, 1, MAX)
if not max then return fail('bad max: ' .. tostring(ARGV[1])) end
local step, burst = arg_int(2, 1, MAX_FILL), arg_int(3, 1, MAX)
if not step or not burst or burst * step > MAX_FILL then
  return fail('bad interval or burst')
end

local now = now_us()
local tag = 'g' .. ARGV[2] .. 'x' .. ARGV[3]
local tat, refused = gcra_tat(KEYS[1], now, tag, adopt)
if not tat then return refused end

local room = burst * step - (tat - now)
local available = 0
if room > 0 then available = floor_div(room, step) end
local granted = math.min(max, available)
if granted > 0 then
  tat = tat + granted * step
  redis.call('SET', KEYS[1], tag .. ':' .. string.format('%d', tat), 'PXAT', ceil_div(tat, 1000))
end
return {granted, now, tat}
