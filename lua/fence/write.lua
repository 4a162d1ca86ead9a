-- fence/write: store a value in a fenced resource, only under the newest grant.
--
-- KEYS[1]  the value: a hash with two fields,
--            value  the protected value (any bytes)
--            fence  the fence of the grant that last wrote it, a decimal string
-- KEYS[2]  optional: the resource's fence counter (written by fence/acquire and
--          fence/advance; same hash tag as KEYS[1]). Without it the write is
--          checked only against the stored fence (the weaker `write_unbound`).
-- ARGV[1]  fence  the writer's fence: a decimal u64 without leading zeros,
--                 1 <= fence <= 2^64-1, compared exactly (as digits, not as
--                 Lua doubles, which would merge neighbours above 2^53).
-- ARGV[2]  value  the bytes to store.
--
-- Reply: {status, fence}
--   status = 1: applied; the value was stored with ARGV[1]. fence is ARGV[1].
--   status = 0: stale; a newer grant exists: the counter (or the stored fence)
--               is greater than ARGV[1]. fence is that greater fence. Nothing
--               was written.
--   status = 2: not granted; ARGV[1] is above the counter, so no grant ever
--               carried it (a made-up fence, or a counter that went back: a
--               restart without persistence, a failover). fence is the counter
--               ("0" when there is none). Nothing was written.
--
-- With KEYS[2], only the fence equal to the counter, i.e. the newest grant's,
-- is accepted, whether or not that grant has written yet. An EQUAL stored
-- fence is accepted: one grant may write several times (a multi-step update,
-- or a retry after a lost reply). Without KEYS[2], any fence not below the
-- stored one is accepted (a paused holder can still write until the newer
-- holder's first write lands).
--
-- Guarantees: compare and write in one atomic step, everything checked before
-- the first write; the value and its fence are always written together. A key
-- of another type, a hash without a canonical fence field, or a counter that
-- is not a canonical decimal is an error and nothing is written.
--
-- Example: counter "9", value {value "a", fence "7"}: write 9 "b" gives
-- {1, "9"}; write 8 "c" gives {0, "9"}; write 10 "d" gives {2, "9"}.

--@include lib/fail
--@include lib/decimal
--@include lib/fenced

local fence, refused = fenced_args()
if not fence then return refused end

if KEYS[2] then
  local counter = redis.call('GET', KEYS[2])
  if counter and not dec_canonical(counter, I64_MAX) then
    return fail(KEYS[2] .. ' holds a non-counter value')
  end
  counter = counter or '0'
  if dec_less(fence, counter) then
    return {0, counter}
  end
  if dec_less(counter, fence) then
    return {2, counter}
  end
end

return fenced_store(KEYS[1], fence, ARGV[2])
