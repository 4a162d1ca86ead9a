#!lua flags=allow-oom
-- semaphore/release_fair: semaphore/release, then wake the first waiters in line whose weights fit the free permits.
--
-- KEYS[1]  the semaphore written by semaphore/acquire_fair (or acquire).
-- KEYS[2]  the line of semaphore/acquire_fair (`keys::derive(key,
--          "queue")`, a name ending in ":queue"); the waiters are woken on
--          the pub/sub channel of the same name ending in ":released"
--          instead (`keys::derive(key, "released")`).
-- KEYS[3]  its deadlines (`keys::derive(key, "queue:alive")`).
-- ARGV[1]  id      the permit id, 32 lowercase hex digits.
-- ARGV[2]  weight  integer 1..10000, how many permits the id was granted.
--
-- Reply: {released}, exactly as semaphore/release (1 released, 0 lost,
-- NOLOCK_WEIGHT for another weight; the same checks before any write).
--
-- Wake-up: when the call removed permits, the line exists and the set is
-- tagged with its size P ("by:m<P>", which every grant writes), dead
-- tickets are dropped (lib/queue) and the tickets at the head of the line
-- whose weights add up to at most P minus the unexpired permits left are
-- PUBLISHed on the channel, one message each, in line order, stopping at
-- the first that does not fit (strict FIFO: those behind it would not be
-- granted either). A waiter of `fence::Waiters` hears its own ticket and
-- tries at once; the others sleep to their fallback. The PUBLISH comes
-- after the removal and cannot undo it (redis.pcall); a line of another
-- type (foreign data) is left alone and wakes nobody.
--
-- Guarantees: those of semaphore/release; the line is only read, except
-- for the dead tickets lib/queue drops. Declared allow-oom (it only frees
-- memory, and PUBLISH and the drops need none to speak of).
--
-- Example: permits 3, "ab..:1".."ab..:3" held by one id; the line holds
-- "c..:1", "d..:1", "e..:2": release "ab..", weight 3: {1}, and "c..:1",
-- "d..:1" published (1 + 1 fit in 3, 1 + 1 + 2 do not).

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits
--@include lib/queue

local key = KEYS[1]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local weight = stored_int(ARGV[2], 1, 10000)
if not weight then return fail('bad weight: ' .. tostring(ARGV[2])) end
if not KEYS[3] or string.sub(KEYS[2], -6) ~= ':queue'
    or KEYS[3] ~= KEYS[2] .. ':alive' then
  return fail('not a queue: ' .. tostring(KEYS[2]) .. ', ' .. tostring(KEYS[3]))
end

local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag = permit_bounds(key)
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end

local now = math.floor(now_us() / 1000)
local holding = permit_holding(key, id, weight, now)
if holding == 'weight' then return permit_weight_error() end
local held = 0
if holding == 'held' then held = 1 end
local members = {}
for i = 1, weight do
  members[i] = id .. ':' .. i
end

-- As semaphore/release: the set is read again only if a permit is left.
local left = redis.call('ZCARD', key)
local removed = 0
for i = 1, weight, 200 do
  removed = removed + redis.call('ZREM', key, unpack(members, i, math.min(i + 199, weight)))
end
left = left - removed
local in_use = 0
if tag and left == 1 then
  redis.call('DEL', key)
elseif left > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, math.ceil(tonumber(last[2])))
  -- The unexpired permits: all but the tag and the expired ones.
  in_use = left - #redis.call('ZRANGEBYSCORE', key, 1, now)
  if tag then in_use = in_use - 1 end
end

if removed > 0 and tag
    and redis.call('TYPE', KEYS[2]).ok == 'zset'
    and redis.call('TYPE', KEYS[3]).ok == 'zset' then
  local free = tonumber(string.sub(tag, 2)) - in_use
  if free > 0 then
    queue_head(KEYS[2], KEYS[3], now)
    local channel = string.sub(KEYS[2], 1, -6) .. 'released'
    local sum = 0
    for _, t in ipairs(redis.call('ZRANGE', KEYS[2], 0, free - 1)) do
      local w = permit_member(t) and tonumber(string.match(t, ':(%d+)$'))
      if not w or sum + w > free then break end
      sum = sum + w
      redis.pcall('PUBLISH', channel, t)
    end
  end
end
return {held}
