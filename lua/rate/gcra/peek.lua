#!lua flags=no-writes
-- rate/gcra/peek: what rate/gcra/check would answer for `cost`, without taking anything.
--
-- KEYS and ARGV are those of rate/gcra/check (state: TAT in integer
-- microseconds since the Unix epoch; ARGV[1] cost, then interval T and burst b
-- per key).
--
-- Reply: {admitted, now, then per limit: fits, remaining, retry_after, reset_after}
--   as rate/gcra/check, except that nothing is charged: admitted says whether
--   check would admit, and remaining counts the units that fit now,
--   floor((b x T - (tat - now)) / T), before any charge.
--
-- Read-only (flags=no-writes): it runs with EVALSHA_RO, replicas accept it,
-- and Redis itself refuses any write from it.
--
-- Example: 10 per second, burst 10, after 3 quick admissions at N, peeking
-- cost 1 at N + 1000: {1, N + 1000, 1, 7, -1, 299}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/gcra

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local cost = arg_int(1, 1, MAX)
if not cost then return fail('bad cost: ' .. tostring(ARGV[1])) end

local now = now_us()

local reply, admitted = {0, now}, 1
for i = 1, n do
  local step, b = arg_int(2 * i, 1, MAX_FILL), arg_int(2 * i + 1, 1, MAX)
  if not step or not b or b * step > MAX_FILL then
    return fail('bad interval or burst for key ' .. i)
  end
  if cost > b then return fail('cost is above the burst of key ' .. i) end
  local t = gcra_tat(KEYS[i], now)
  if not t then return fail('key ' .. KEYS[i] .. ' does not hold a GCRA state') end
  local room = b * step - (t - now)
  local fits = cost * step <= room
  local remaining, retry = 0, -1
  if room > 0 then remaining = floor_div(room, step) end
  if not fits then
    admitted = 0
    retry = ceil_div(cost * step - room, 1000)
  end
  reply[#reply + 1] = fits and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = retry
  reply[#reply + 1] = ceil_div(t - now, 1000)
end
reply[1] = admitted
return reply
