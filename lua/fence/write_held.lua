-- fence/write_held: store a value in a fenced resource, only while its lock holds the writer's fence.
--
-- KEYS[1]  the value: a hash {value, fence} as fence/write keeps it.
-- KEYS[2]  the resource's lock, "<fence>:<token>" with a TTL, written by
--          fence/acquire_slot (or fence/acquire). Same hash tag as KEYS[1].
-- ARGV[1]  fence  the writer's fence: a canonical decimal in [1, 2^64-1],
--                 compared as digits.
-- ARGV[2]  value  the bytes to store.
--
-- Reply: {status, fence}
--   status = 1: applied; the value was stored with ARGV[1]. fence is ARGV[1].
--   status = 0: stale; the lock holds a greater fence (a newer grant), or the
--               value was written under one. fence is that greater fence.
--   status = 2: not granted; the lock holds a smaller fence, so this
--               resource never had a grant with ARGV[1]. fence is the lock's.
--   status = 3: ended; the lock is free (expired or released) or holds a
--               value nolock did not write. fence is "0".
--   Nothing was written unless status = 1.
--
-- Why the lock and not a counter: with fences drawn from a counter shared by
-- a slot, the counter says nothing about one resource's newest grant. The
-- lock does: it holds exactly one grant's fence, every later grant of the
-- resource replaces it with a greater one, and fences never repeat, so while
-- it holds ARGV[1] no newer grant exists. The price: a grant writes only
-- while its lease lives (fence/write also accepts the newest grant after its
-- lease ended, until someone locks again).
--
-- Guarantees: compare and write in one atomic step, everything checked before
-- the first write; a key of another type, a hash without a canonical fence
-- field, is an error and nothing is written.
--
-- Example: lock "9:ab..", value {value "a", fence "7"}: write 9 "b" gives
-- {1, "9"}; write 8 "c" gives {0, "9"}; write 10 "d" gives {2, "9"}; after
-- the lock expired, write 9 "e" gives {3, "0"}.

--@include lib/decimal
--@include lib/fenced

local fence, refused = fenced_args()
if not fence then return refused end

local holder = redis.call('GET', KEYS[2])
local held = holder and string.match(holder, '^([1-9]%d*):')
if not held or not dec_canonical(held, U64_MAX) then
  return {3, '0'}
end
if dec_less(fence, held) then
  return {0, held}
end
if dec_less(held, fence) then
  return {2, held}
end

return fenced_store(KEYS[1], fence, ARGV[2])
