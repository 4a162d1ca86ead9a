#!lua flags=allow-oom
-- rate/gcra/refund: give `amount` units back to one or more GCRA limits.
--
-- KEYS[i]     limit i: TAT in integer microseconds since the Unix epoch, as
--             written by rate/gcra/check.
-- ARGV[1]     amount    integer, 1 <= amount <= 2^53-1: units to give back.
-- ARGV[2i]    interval  T of limit i, integer microseconds >= 1.
-- ARGV[2i+1]  burst     b of limit i, integer >= 1, with b x T <= 2^51.
--
-- Each limit's TAT moves back by amount x T, but never before now: a limiter
-- cannot hold more than its burst. A limiter that becomes full is deleted
-- (a missing key means full); otherwise its expiry moves to the new TAT.
-- Missing keys stay missing.
--
-- Reply: {remaining_1, ..., remaining_n}: units that fit on each limit after
-- the refund, floor((b x T - (TAT' - now)) / T).
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key is read and checked before the first write.
--
-- Example: 10 per second, burst 10, TAT = now + 500000 (5 taken): refund 3
-- gives TAT' = now + 200000 and {8}; refund 30 deletes the key and gives {10}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local amount = arg_int(1, 1, MAX)
if not amount then return fail('bad amount: ' .. tostring(ARGV[1])) end

local now = now_us()

local interval, burst, tat = {}, {}, {}
for i = 1, n do
  local step, b = arg_int(2 * i, 1, MAX_FILL), arg_int(2 * i + 1, 1, MAX)
  if not step or not b or b * step > MAX_FILL then
    return fail('bad interval or burst for key ' .. i)
  end
  interval[i], burst[i] = step, b
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local v = tonumber(stored)
    if v == nil or v ~= math.floor(v) or v < 0 then
      return fail('key ' .. i .. ' does not hold a GCRA state')
    end
    tat[i] = v
  end
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {}
for i = 1, n do
  local t = now
  if tat[i] and tat[i] > now then
    -- amount x T may exceed 2^53 (then it is inexact), but it only matters
    -- when it is smaller than tat - now, and then it is exact.
    t = math.max(now, tat[i] - amount * interval[i])
    if t == now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], t,
        'PXAT', ceil_div(t, 1000))
    end
  end
  local room = burst[i] * interval[i] - (t - now)
  reply[i] = room > 0 and floor_div(room, interval[i]) or 0
end
return reply
