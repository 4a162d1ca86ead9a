-- semaphore/acquire_fair: take `weight` permits in arrival order: only when they fit together with every live waiter ahead in line.
--
-- KEYS[1]  the semaphore: the sorted set of semaphore/acquire (same
--          members, tag and expiry; extend, release and peek are unchanged).
-- KEYS[2]  the line: a sorted set, member = a waiter's ticket
--          "<id>:<weight>" (its permit id and how many permits it waits
--          for), score = arrival in server microseconds, strictly
--          increasing. A name ending in ":queue"
--          (`keys::derive(key, "queue")`).
-- KEYS[3]  the deadlines: a sorted set, member = ticket, score = the server
--          millisecond after which the ticket is dead; a name ending in
--          ":queue:alive" (`keys::derive(key, "queue:alive")`).
-- ARGV[1]  id       the holder's permit id, 32 lowercase hex digits.
-- ARGV[2]  permits  integer 1..10000, the semaphore's size.
-- ARGV[3]  weight   integer 1..permits, how many permits to take at once.
-- ARGV[4]  ttl      integer milliseconds 1..2^52: the permits' lifetime.
-- ARGV[5]  mode     "join": wait in line (enqueue, or keep the place and
--                   push the deadline); "try": one attempt that does not
--                   join (granted only if the permits fit together with
--                   the whole line's); "leave": give the place up (never
--                   grants).
-- ARGV[6]  life     with "join": integer milliseconds 1..2^53-1, the
--                   ticket's deadline is now + life; otherwise "0".
-- ARGV[7]  "adopt"  optional, as semaphore/acquire's ARGV[5].
--
-- Reply: {1, in_use}   acquired (as semaphore/acquire); the ticket left the line
--        {0, retry_after, in_use, position}  not granted: retry_after as
--                      semaphore/acquire's when the permits do not fit, 0
--                      when they fit but are promised to waiters ahead;
--                      position = the caller's place in line (1 = first;
--                      0 when not in line: "try", "leave")
--        errors NOLOCK_WEIGHT, NOLOCK_STATE as semaphore/acquire.
--
-- The rule (strict FIFO with weights): a caller is granted when its weight
-- plus the weights of every live ticket ahead of it (the whole line, for a
-- caller not in it) fit in the free permits. So a grant never takes a
-- permit that an earlier waiter needs: nobody is passed over, and a heavy
-- head is not starved by light ones behind it (they wait behind it). The
-- first waiters whose weights fit together are all granted at their next
-- call: one release of several permits lets several waiters in.
--
-- Guarantees: every call first drops the tickets whose deadline has come
-- (lib/queue), and a ticket it walks past that is not nolock's (another
-- form, no deadline), so a waiter that stops calling leaves the line at
-- most `life` ms after its last call. The walk reads at most
-- free - weight + 1 tickets (again after dropping foreign ones). A ticket keeps its arrival while it lives; one
-- that died and comes back is queued at the back. A re-entry (the id holds
-- its permits: a lost reply) refreshes them, as semaphore/acquire, and
-- leaves the line. The line's keys expire (PEXPIREAT) at their latest
-- deadline. Never more than `permits` unexpired permits. Everything is
-- checked before the first write (arguments, the line's key names and
-- types, the semaphore as semaphore/acquire checks it); otherwise an error
-- naming the key, nothing written.
--
-- Example: permits 3, held by one id of weight 3 expiring at T: "a..:1"
-- joins: {0, T - now, 3, 1}; "b..:2" joins: {0, .., 3, 2}; "c..:1" joins:
-- {0, .., 3, 3}. The holder releases (3 free). b calls first: 1 (a) + 2
-- fits: {1, 2}. c calls: 1 free, a's 1 ahead: {0, 0, 2, 2}. a calls: {1,
-- 3}. A "try" of weight 1 meanwhile: {0, 0, 2, 0}.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits
--@include lib/tag
--@include lib/queue

local key = KEYS[1]
local id = ARGV[1]
if not permit_id(id) then
  return fail('bad permit id')
end
local permits = stored_int(ARGV[2], 1, 10000)
if not permits then return fail('bad permits: ' .. tostring(ARGV[2])) end
local weight = stored_int(ARGV[3], 1, permits)
if not weight then return fail('bad weight: ' .. tostring(ARGV[3])) end
local ttl = stored_int(ARGV[4], 1, 4503599627370496)
if not ttl then return fail('bad ttl: ' .. tostring(ARGV[4])) end
local mode = ARGV[5]
if mode ~= 'join' and mode ~= 'try' and mode ~= 'leave' then
  return fail('bad mode: ' .. tostring(mode))
end
local life = 0
if mode == 'join' then
  life = stored_int(ARGV[6], 1, 9007199254740991)
  if not life then return fail('bad life: ' .. tostring(ARGV[6])) end
elseif ARGV[6] ~= '0' then
  return fail('bad life: ' .. tostring(ARGV[6]))
end
local adopt = tag_adopt(6)
if adopt == nil then return fail('expected 6 arguments and "adopt", got ' .. #ARGV) end
local ours = 'm' .. ARGV[2]
if not KEYS[3] or string.sub(KEYS[2], -6) ~= ':queue'
    or KEYS[3] ~= KEYS[2] .. ':alive' then
  return fail('not a queue: ' .. tostring(KEYS[2]) .. ', ' .. tostring(KEYS[3]))
end
for i = 2, 3 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'zset' and kind ~= 'none' then
    return fail(KEYS[i] .. ': waiting line holds a ' .. kind .. ', not a sorted set')
  end
end

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local ok, tag, highest = true, nil, nil
if kind == 'zset' then ok, tag, highest = permit_bounds(key) end
if not ok then
  return fail(key .. ' holds a sorted set that is not a semaphore')
end
if tag and not tag_same(tag, ours, adopt) then return tag_refuse(key, tag, ours) end
local tagged = 0
if tag then tagged = 1 end

local now_micros = now_us()
local now = math.floor(now_micros / 1000)
local expiry = now + ttl

local expired = redis.call('ZRANGEBYSCORE', key, 1, now)
for _, m in ipairs(expired) do
  if not permit_member(m) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end
local in_use = redis.call('ZCARD', key) - #expired - tagged

local holding = permit_holding(key, id, weight, now)
if holding == 'weight' then return permit_weight_error() end
local mine = holding == 'held'
local ticket = id .. ':' .. weight

-- Writes start here (the order of semaphore/acquire's, for the same reasons).
local function clear_expired()
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, 1, now)
  end
end
local function add_mine()
  local args = {}
  for i = 1, weight do
    args[#args + 1] = expiry
    args[#args + 1] = id .. ':' .. i
    if #args >= 200 or i == weight then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if tag ~= ours then
    redis.call('ZADD', key, 0, 'by:' .. ours)
    if tag then redis.call('ZREM', key, 'by:' .. tag) end
  end
  local latest = expiry
  if highest and highest > latest then latest = highest end
  redis.call('PEXPIREAT', key, latest)
end
local function leave_line()
  redis.call('ZREM', KEYS[2], ticket)
  redis.call('ZREM', KEYS[3], ticket)
end

if mode == 'leave' then
  leave_line()
  return {0, 0, in_use, 0}
end
if mine then
  add_mine()
  clear_expired()
  leave_line()
  return {1, in_use}
end

-- Walk the line from its head: the weights ahead of the caller (all of
-- them, for a caller not in line) must leave room for its own.
queue_head(KEYS[2], KEYS[3], now)
local free = permits - in_use
local queued = redis.call('ZSCORE', KEYS[2], ticket)
local fits = false
if free >= weight then
  -- Foreign tickets are dropped as they are met; the window is then read
  -- again, so that what they hid is counted too.
  local found, dropped
  repeat
    local ahead = 0
    found, dropped, fits = false, false, true
    local walked = redis.call('ZRANGE', KEYS[2], 0, free - weight)
    for _, t in ipairs(walked) do
      if t == ticket then
        found = true
        break
      end
      local w = permit_member(t) and redis.call('ZSCORE', KEYS[3], t)
        and tonumber(string.match(t, ':(%d+)$'))
      if w then
        ahead = ahead + w
        if ahead + weight > free then
          fits = false
          break
        end
      else
        -- Not nolock's ticket: it blocks nobody.
        redis.call('ZREM', KEYS[2], t)
        redis.call('ZREM', KEYS[3], t)
        dropped = true
      end
    end
  until not dropped or found or not fits
  -- In line but beyond the window: the weights ahead fill the free permits.
  if queued and not found then fits = false end
end

if fits then
  add_mine()
  clear_expired()
  if queued then leave_line() end
  return {1, in_use + weight}
end
clear_expired()
local retry_after = 0
if in_use + weight > permits then
  local rank = in_use + weight - permits - 1 + tagged
  local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  retry_after = math.ceil(tonumber(pair[2]) - now)
end
if #expired > 0 and redis.call('EXISTS', key) == 1 and highest then
  redis.call('PEXPIREAT', key, highest)
end

local position = 0
if mode == 'join' then
  if not queued then
    local arrival = now_micros
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
    if last and tonumber(last) >= arrival then
      arrival = tonumber(last) + 1
    end
    redis.call('ZADD', KEYS[2], arrival, ticket)
  end
  redis.call('ZADD', KEYS[3], now + life, ticket)
  local latest = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIREAT', KEYS[2], latest)
  redis.call('PEXPIREAT', KEYS[3], latest)
  position = redis.call('ZRANK', KEYS[2], ticket) + 1
end
return {0, retry_after, in_use, position}
