-- rate/reset: forget the state of one or more limits (they are full again), and end the power of every charge taken on them until now.
--
-- KEYS[i]      limit i (i = 1..n), any algorithm's state (or missing):
--              deleted, whatever it holds (a missing key is a full limit).
-- KEYS[n + i]  limit i's reset marker: keys::derive(limit key, "reset"), a
--              canonical integer: the server time (microseconds since the
--              Unix epoch) of the latest reset. lib/refund reads it: a refund
--              or settlement of a charge taken at or before it changes
--              nothing (answers status 2), since the units that charge took
--              were forgiven here and later checks may have used them.
-- ARGV[i]      horizon of limit i: integer milliseconds >= 1, how long a
--              charge taken before now could still give units back (GCRA and
--              token bucket: burst x T; fixed window: one window; sliding
--              window: two). The marker is kept that long, or as long as it
--              was already kept if that is later; after it, such a refund
--              gives nothing back by its own rules.
--
-- Reply: {now}, the server time of the reset (integer microseconds).
--
-- Guarantees: every marker is read and checked before the first write; a
-- marker that is not a canonical integer is foreign data: a definite error,
-- nothing deleted. A marker never goes back (max of the old and now).
--
-- Example: a GCRA limit of 10 per hour at KEYS[1]: horizon 3600000; after
-- the reset KEYS[1] is gone and KEYS[2] holds now until now + 1 h.

--@include lib/fail
--@include lib/args
--@include lib/stored
--@include lib/time

local MAX = 9007199254740991
local n = #KEYS / 2
if n < 1 or n % 1 ~= 0 or #ARGV ~= n then
  return fail('expected a limit key and a marker key per limit and one horizon per limit, got '
    .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local now = now_us()
local now_ms = math.floor(now / 1000)
local marks, until_ms = {}, {}
for i = 1, n do
  local horizon = arg_int(i, 1, MAX - now_ms)
  if not horizon then return fail('bad horizon for limit ' .. i) end
  local mark, keep = now, now_ms + horizon
  local old = redis.call('GET', KEYS[n + i])
  if old then
    local v = stored_int(old, 0, MAX)
    if not v then return fail('key ' .. KEYS[n + i] .. ' does not hold a reset time') end
    if v > mark then mark = v end
    local expiry = redis.call('PEXPIRETIME', KEYS[n + i])
    if expiry > keep then keep = expiry end
  end
  marks[i], until_ms[i] = mark, keep
end
for i = 1, n do
  redis.call('DEL', KEYS[i])
  redis.call('SET', KEYS[n + i], marks[i], 'PXAT', until_ms[i])
end
return {now}
