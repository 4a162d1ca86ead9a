-- semaphore/acquire_fenced: take one permit of a semaphore of `permits` with a seat and a fence: the lowest free seat 1..permits and the slot counter's next value.
--
-- KEYS[1]  the semaphore, exactly as semaphore/acquire keeps it: a sorted
--          set of "<id>:<i>" scored with expiries (server ms) and the tag
--          "by:m<permits>" scored 0. A fenced permit is the member
--          "<id>:1", so plain and fenced calls count the same permits.
-- KEYS[2]  its seats: a hash, seat "<s>" (canonical integer 1..10000) ->
--          "<fence>:<id>" (fence a canonical decimal, id a permit id), the
--          seat's latest grant. keys::derive(KEYS[1], "seats"); same slot.
--          It expires (PEXPIREAT) no earlier than the semaphore's latest
--          permit when this call or semaphore/extend_fenced wrote it.
-- KEYS[3]  the slot's fence counter "{<tag>}!nolock:fences" (fence/slot):
--          an integer string with NO TTL, shared with slot-fenced locks;
--          same slot as KEYS[1].
-- ARGV[1]  id       the holder's permit id, 32 lowercase hex digits.
-- ARGV[2]  permits  integer 1..10000, the semaphore's size.
-- ARGV[3]  ttl      integer milliseconds 1..2^52: the permit's lifetime.
--
-- Reply: {1, in_use, seat, fence}  acquired (fence as decimal digits)
--        {0, retry_after, in_use}  full, as semaphore/acquire answers it
--        error NOLOCK_WEIGHT       the id holds unexpired permits of weight
--                                  above 1; nothing written
--        error NOLOCK_STATE        the set is tagged with another size
--
-- A seat is held while its entry's id holds an unexpired "<id>:1": a
-- released or expired holder's seat is free without anything removed. A
-- grant takes the lowest free seat 1..permits and draws fence = counter +
-- 1 (the counter is set to it); an id named by a seat entry takes that
-- seat again, so no id is named by two entries.
-- Weight 1 only: admission is semaphore/acquire's for weight 1, so held
-- seats <= holders of "<id>:1" <= permits, and a free seat always exists
-- for an admitted id.
--
-- Guarantees: the counter only grows and every grant of a seat draws from
-- it, so per seat (and per slot) fences strictly increase and never repeat,
-- even after the seats hash expired. A holder whose id already holds its
-- seat (a retry after a lost reply) gets the same seat and fence with a
-- fresh expiry. Everything is checked before the first write: the set as
-- semaphore/acquire checks it, every seat entry (field and value form), the
-- counter (a canonical decimal below 2^63-1); otherwise a definite error.
--
-- Example: empty keys, counter "41", permits 2, ttl 1000: {1, 1, 1, "42"},
--   seats {"1": "42:<id>"}; another id: {1, 2, 2, "43"}; a third: {0, ms, 2}.
--   After the first released, a fourth id: {1, 2, 1, "44"}.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/decimal
--@include lib/permits
--@include lib/tag

local key, seats_key, counter_key = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local permits = stored_int(ARGV[2], 1, 10000)
if not permits then return fail('bad permits: ' .. tostring(ARGV[2])) end
local ttl = stored_int(ARGV[3], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[3])) end
if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
local ours = 'm' .. ARGV[2]

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag, highest = true, nil, nil
if kind == 'zset' then ok, tag, highest = permit_bounds(key) end
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end
if tag and not tag_same(tag, ours, false) then return tag_refuse(key, tag, ours) end
local tagged = 0
if tag then tagged = 1 end

local seats_kind = redis.call('TYPE', seats_key).ok
if seats_kind ~= 'hash' and seats_kind ~= 'none' then
  return fail(seats_key .. ' holds a ' .. seats_kind .. ', not a semaphore\'s seats')
end
-- seat -> {fence, id}, every entry checked.
local seats = {}
local flat = redis.call('HGETALL', seats_key)
for i = 1, #flat, 2 do
  local s = stored_int(flat[i], 1, 10000)
  local f, holder = string.match(flat[i + 1], '^(%d+):(.*)$')
  if not s or not f or not dec_canonical(f, U64_MAX) or not permit_id(holder) then
    return fail(seats_key .. ' holds an entry that is not a seat')
  end
  seats[s] = {f, holder}
end

local counter = redis.call('GET', counter_key) or '0'
if counter ~= '0' and not dec_canonical(counter, '9223372036854775806') then
  return fail(counter_key .. ': fence counter holds a non-counter value (or is at its limit)')
end

local now = math.floor(now_us() / 1000)
local expiry = now + ttl

local expired = redis.call('ZRANGEBYSCORE', key, 1, now)
for _, m in ipairs(expired) do
  if not permit_member(m) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end
local in_use = redis.call('ZCARD', key) - #expired - tagged

local holding = permit_holding(key, id, 1, now)
if holding == 'weight' then return permit_weight_error() end
local mine = holding == 'held'

local function holder_live(holder)
  local score = redis.call('ZSCORE', key, holder .. ':1')
  return score and tonumber(score) > now
end

if not mine and in_use + 1 > permits then
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, 1, now)
  end
  local rank = in_use - permits + tagged
  local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  local retry_after = math.ceil(tonumber(pair[2]) - now)
  if #expired > 0 and redis.call('EXISTS', key) == 1 and highest then
    redis.call('PEXPIREAT', key, highest)
  end
  return {0, retry_after, in_use}
end

-- This id's seat, when an entry names it (a retry keeps its fence; an id
-- whose permit expired takes its seat again with a new fence); else the
-- lowest free seat. So no id is named by two entries.
local seat, fence
for s, entry in pairs(seats) do
  if entry[2] == id and s <= permits and (seat == nil or s < seat) then seat = s end
end
if seat and mine then fence = seats[seat][1] end
if not seat then
  for s = 1, permits do
    local entry = seats[s]
    if entry == nil or not holder_live(entry[2]) then
      seat = s
      break
    end
  end
  if not seat then
    return fail(seats_key .. ': no free seat for an admitted permit (seats not written by nolock)')
  end
end

-- Writes start here.
if not fence then
  -- counter + 1, as digits (counter < 2^63-1, as fence/acquire_slot does).
  local head, nines = string.match('0' .. counter, '^(.-)(9*)$')
  fence = string.sub(head, 1, -2) .. string.char(string.byte(head, -1) + 1)
    .. string.rep('0', #nines)
  fence = string.match(fence, '^0*(.*)$')
  redis.call('SET', counter_key, fence)
  redis.call('HSET', seats_key, seat, fence .. ':' .. id)
end

redis.call('ZADD', key, expiry, id .. ':1')
if tag ~= ours then
  redis.call('ZADD', key, 0, 'by:' .. ours)
  if tag then redis.call('ZREM', key, 'by:' .. tag) end
end
local latest = expiry
if highest and highest > latest then latest = highest end
redis.call('PEXPIREAT', key, latest)
local left = redis.call('PTTL', seats_key)
if left < 0 or now + left < latest then
  redis.call('PEXPIREAT', seats_key, latest)
end
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', key, 1, now)
end
if mine then return {1, in_use, seat, fence} end
return {1, in_use + 1, seat, fence}
