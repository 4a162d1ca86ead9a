#!lua flags=allow-oom
-- semaphore/extend_fenced: set a fenced permit to expire `ttl` ms from now, only while it is unexpired and still holds its seat with its fence.
--
-- KEYS[1]  the semaphore written by semaphore/acquire_fenced.
-- KEYS[2]  its seats hash (semaphore/acquire_fenced), same slot.
-- ARGV[1]  id     the permit id, 32 lowercase hex digits.
-- ARGV[2]  seat   integer 1..10000, the permit's seat.
-- ARGV[3]  fence  the permit's fence: a canonical decimal in [1, 2^64-1].
-- ARGV[4]  ttl    integer milliseconds 1..2^52, counted from now.
--
-- Reply: {extended}
--   1  "<id>:1" was unexpired and the seat holds "<fence>:<id>": the permit
--      now expires at now + ttl, the set and the seats no earlier
--   0  the permit expired or was released, or its seat holds another grant:
--      nothing written (an expired permit is never brought back)
--   error NOLOCK_WEIGHT  the id holds more than one permit (not a fenced
--      permit); nothing written
--
-- Guarantees: touches only this id's member and the two keys' expiries.
-- Before the first write the set must have nolock's form (lib/permits
-- permit_bounds) and the seats key must be a hash whose entry for the seat,
-- if any, is "<fence>:<id>"-shaped; otherwise a definite error, nothing
-- written. Declared allow-oom: a holder keeps its permit on a full server.
--
-- Example: seat 2 holds "44:ab..", "ab..:1" unexpired: extend "ab.." 2 44
--   1000 gives {1}; extend "ab.." 2 43 1000 gives {0}.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/decimal
--@include lib/permits

local key, seats_key = KEYS[1], KEYS[2]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local seat = stored_int(ARGV[2], 1, 10000)
if not seat then return fail('bad seat: ' .. tostring(ARGV[2])) end
local fence = ARGV[3]
if not dec_canonical(fence, U64_MAX) then return fail('bad fence: ' .. tostring(fence)) end
local ttl = stored_int(ARGV[4], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[4])) end

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local seats_kind = redis.call('TYPE', seats_key).ok
if seats_kind ~= 'hash' and seats_kind ~= 'none' then
  return fail(seats_key .. ' holds a ' .. seats_kind .. ', not a semaphore\'s seats')
end
local entry = redis.call('HGET', seats_key, seat)
if entry then
  local f, holder = string.match(entry, '^(%d+):(.*)$')
  if not f or not dec_canonical(f, U64_MAX) or not permit_id(holder) then
    return fail(seats_key .. ' holds an entry that is not a seat')
  end
end
if kind == 'none' then return {0} end
local ok, _, highest = permit_bounds(key)
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end

local now = math.floor(now_us() / 1000)
local holding = permit_holding(key, id, 1, now)
if holding == 'weight' then return permit_weight_error() end
if holding == 'none' or entry ~= fence .. ':' .. id then return {0} end

local expiry = now + ttl
redis.call('ZADD', key, 'XX', expiry, id .. ':1')
if highest < expiry then highest = expiry end
redis.call('PEXPIREAT', key, highest)
local left = redis.call('PTTL', seats_key)
if left < 0 or now + left < highest then
  redis.call('PEXPIREAT', seats_key, highest)
end
return {1}
