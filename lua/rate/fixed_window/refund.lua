#!lua flags=allow-oom
-- rate/fixed_window/refund: give back units of one admitted charge, only while the charge's window is still counted.
--
-- KEYS[i]     limit i (i = 1..n): a counter as written by
--             rate/fixed_window/check, whose expiry is its window's end;
--             KEYS[n + 1] the charge's record (lib/refund).
-- ARGV[1]     amount  integer >= 1: units to give back.
-- ARGV[2]     at      integer microseconds: the server time of the charge
--                     (the `now` of its reply).
-- ARGV[3]     cost    integer >= 1: what the charge took.
-- ARGV[4i]    window  w of limit i, integer milliseconds >= 1.
-- ARGV[4i+1]  limit   L of limit i, integer >= 1.
-- ARGV[4i+2]  held    integer in [0, cost]: the units of the charge not yet
--                     given back on limit i, as the client counts them; the
--                     record's count wins when lower.
-- ARGV[4i+3]  reset   the charge's reset_after on limit i, integer ms.
--
-- The charge was counted in the window ending at end = floor(at / 1000) +
-- reset (check answers reset = end - now in ms, exactly). A counter whose
-- window still ends at `end` drops by min(amount, held, count); a counter of any
-- other window (the charge's window ended, a new one began) is left alone:
-- units refunded there would be units the new window never charged. The
-- window (expiry) is kept. The record keeps what is left of the charge
-- until the last of its windows ends.
--
-- Reply: {credited_1, remaining_1, ..., credited_n, remaining_n}
--   credited   units taken off counter i
--   remaining  L - count afterwards, never below 0
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: limit 10, 7 counted in the window ending at E; a refund of 3
-- from a charge whose end is E gives {3, 6}; from a charge of the window
-- before, {0, 3}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/fixed
--@include lib/refund

local MAX = 9007199254740991

local n, amount, at, cost, held = refund_begin()
if not n then return fail(amount) end

local now = floor_div(now_us(), 1000)
local charged_in = floor_div(at, 1000)

local limit, count, take, until_ms = {}, {}, {}, now
for i = 1, n do
  local w, l = arg_int(4 * i, 1, MAX), arg_int(4 * i + 1, 1, MAX)
  local reset = arg_int(4 * i + 3, 0, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  local c, e = fixed_read(KEYS[i], now)
  if not c then return fail('key ' .. KEYS[i] .. ' does not hold a counter') end
  limit[i], count[i], take[i] = l, c, 0
  if e == charged_in + reset then take[i] = math.min(amount, held[i], c) end
  until_ms = math.max(until_ms, charged_in + reset)
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {}
for i = 1, n do
  local c = count[i]
  if take[i] > 0 then c = redis.call('DECRBY', KEYS[i], take[i]) end
  reply[#reply + 1] = take[i]
  reply[#reply + 1] = math.max(0, limit[i] - c)
end
refund_end(n, held, take, until_ms + 1)
return reply
