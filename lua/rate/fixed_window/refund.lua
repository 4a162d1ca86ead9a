#!lua flags=allow-oom
-- rate/fixed_window/refund: give `amount` units back to one or more fixed windows.
--
-- KEYS[i]     limit i: an integer counter as written by rate/fixed_window/check,
--             whose expiry is its window's end.
-- ARGV[1]     amount  integer, 1 <= amount <= 2^53-1: units to give back.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1 (unused; kept
--                     so that every rate script takes the same arguments).
-- ARGV[2i+1]  limit   L of limit i, integer >= 1.
--
-- Each counter in an open window drops by min(amount, count): never below
-- zero. The window (expiry) is kept, so a refund does not open a new window.
-- Missing keys and ended windows are left alone (they already count 0).
--
-- Reply: {remaining_1, ..., remaining_n}: L - count afterwards, never below 0.
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key is read and checked before the first write.
--
-- Example: limit 10, count 7: refund 3 gives {6}; refund 30 then gives {10}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/stored
--@include lib/time

local MAX = 9007199254740991

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local amount = arg_int(1, 1, MAX)
if not amount then return fail('bad amount: ' .. tostring(ARGV[1])) end

local now = floor_div(now_us(), 1000)

local limit, count = {}, {}
for i = 1, n do
  local w, l = arg_int(2 * i, 1, MAX), arg_int(2 * i + 1, 1, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  limit[i] = l
  local c = 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    c = stored_int(stored, 0, MAX)
    if c == nil then
      return fail('key ' .. i .. ' does not hold a counter')
    end
    local e = redis.call('PEXPIRETIME', KEYS[i])
    if e >= 0 and now >= e then c = 0 end -- the window has ended
  end
  count[i] = c
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {}
for i = 1, n do
  local c = count[i]
  local take = math.min(amount, c)
  if take > 0 then c = redis.call('DECRBY', KEYS[i], take) end
  reply[i] = math.max(0, limit[i] - c)
end
return reply
