-- semaphore/write_fenced: store a value for a fenced permit's seat, only while the permit is unexpired and its seat holds the permit's fence.
--
-- KEYS[1]  the value: a hash {value, fence} as fence/write keeps it (lib/
--          fenced), one per (semaphore, seat): keys::derive(KEYS[2],
--          "value:<seat>").
-- KEYS[2]  the semaphore written by semaphore/acquire_fenced.
-- KEYS[3]  its seats hash, "<seat>" -> "<fence>:<id>". Same slot as KEYS[2].
-- ARGV[1]  fence  the writer's fence: a canonical decimal in [1, 2^64-1].
-- ARGV[2]  value  the bytes to store.
-- ARGV[3]  id     the writer's permit id, 32 lowercase hex digits.
-- ARGV[4]  seat   integer 1..10000, the writer's seat.
--
-- Reply: {status, fence}, as fence/write_held answers:
--   1  applied: the seat holds "<fence>:<id>", "<id>:1" is unexpired, and
--      the value holds no greater fence; stored with ARGV[1]
--   0  stale: the seat (or the value) holds a greater fence, a newer grant
--      of the seat; fence is that one
--   2  not granted: the seat holds a smaller fence, or this fence under
--      another id; fence is the seat's
--   3  ended: the seat holds no grant, or the permit expired or was
--      released; fence is "0"
--   Nothing was written unless status = 1.
--
-- Why the seat and not the counter: the slot's counter is shared, so it
-- says nothing about one seat. The seat holds exactly one grant's fence;
-- every later grant of the seat replaces it with a greater one (fences
-- never repeat), so while it holds ARGV[1] and the permit is unexpired no
-- newer holder of the seat exists. The value's own fence is a watermark
-- per (semaphore, seat), as a database row keeps one.
--
-- Guarantees: compare and write in one atomic step, everything checked
-- before the first write: a key of another type, a seat entry or value not
-- in nolock's form, is a definite error and nothing is written.
--
-- Example: seat 1 holds "42:ab..", "ab..:1" unexpired, value {fence "40"}:
--   write 42 "x" "ab.." 1 gives {1, "42"}; write 41 gives {0, "42"}; after
--   "ab..:1" expired, write 42 gives {3, "0"}.

--@include lib/fail
--@include lib/decimal
--@include lib/fenced
--@include lib/stored
--@include lib/time
--@include lib/permits

local fence, refused = fenced_args()
if not fence then return refused end
local id = ARGV[3]
if not permit_id(id) then return fail('bad permit id') end
local seat = stored_int(ARGV[4], 1, 10000)
if not seat then return fail('bad seat: ' .. tostring(ARGV[4])) end

local kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(KEYS[2] .. ' holds a ' .. kind .. ', not a semaphore')
end
local seats_kind = redis.call('TYPE', KEYS[3]).ok
if seats_kind ~= 'hash' and seats_kind ~= 'none' then
  return fail(KEYS[3] .. ' holds a ' .. seats_kind .. ', not a semaphore\'s seats')
end

local entry = redis.call('HGET', KEYS[3], seat)
if not entry then return {3, '0'} end
local held, holder = string.match(entry, '^(%d+):(.*)$')
if not held or not dec_canonical(held, U64_MAX) or not permit_id(holder) then
  return fail(KEYS[3] .. ' holds an entry that is not a seat')
end
if dec_less(fence, held) then return {0, held} end
if dec_less(held, fence) or holder ~= id then return {2, held} end

local now = math.floor(now_us() / 1000)
local score = redis.call('ZSCORE', KEYS[2], id .. ':1')
if not score or tonumber(score) <= now then return {3, '0'} end

return fenced_store(KEYS[1], fence, ARGV[2])
