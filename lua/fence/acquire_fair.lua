-- fence/acquire_fair: take a lock in arrival order: only when it is free and the caller is first in its waiting line.
--
-- KEYS[1]  the lock: "<fence>:<token>" with a TTL, exactly as fence/acquire
--          and fence/acquire_slot write it (extend, release and the fenced
--          writes are unchanged).
-- KEYS[2]  the line: a sorted set, member = a waiter's ticket (its token),
--          score = arrival in server microseconds, strictly increasing.
--          A name ending in ":queue" (`keys::derive(resource, "queue")`);
--          the channel on which the head is woken is the same name ending
--          in ":released" instead.
-- KEYS[3]  the deadlines: a sorted set, member = ticket, score = the server
--          millisecond after which the ticket is dead
--          (`keys::derive(resource, "queue:alive")`).
-- KEYS[4]  the fence counter this grant writes: the resource's ("{r}:fence",
--          as fence/acquire) or the slot's (as fence/acquire_slot).
-- KEYS[5]  optional: with a slot counter in KEYS[4], the resource's own
--          counter, only read (as KEYS[3] of fence/acquire_slot).
-- ARGV[1]  token   non-empty string: the owner token, also the ticket.
-- ARGV[2]  ttl     integer milliseconds, 1 <= ttl <= 2^53-1: the lock's expiry.
-- ARGV[3]  mode    "join": wait in line (enqueue, or keep the place and
--                  push the deadline); "try": one attempt that does not
--                  join (granted only if the lock is free and the line is
--                  empty or starts with the caller); "leave": give the
--                  place up (never grants).
-- ARGV[4]  life    with "join": integer milliseconds, 1 <= life <= 2^53-1:
--                  the ticket's deadline is now + life (the caller comes
--                  back before it, or is dropped from the line).
--
-- Reply: {1, fence}  granted: fence is a decimal STRING, as fence/acquire's
--                    (or fence/acquire_slot's, with KEYS[5]); the caller's
--                    ticket has left the line.
--        {0, pttl, position}  not granted: pttl = the lock's PTTL in ms (-1
--                    without an expiry, -2 when it is free but another
--                    ticket is first); position = the caller's place in
--                    line, 1 = first (0 when not in line: "try", "leave").
--
-- Guarantees: every call first drops the tickets whose deadline has come,
-- so a waiter that stops calling leaves the line at most `life` ms after
-- its last call. The check, the draw and the SET happen in one atomic step,
-- with the fence rules of fence/acquire (or fence/acquire_slot): strictly
-- increasing per resource. A ticket keeps its arrival while it lives; one
-- that died and comes back is queued at the back. A re-entry (the lock
-- holds ARGV[1]) sets the TTL again and answers the stored fence. The line's
-- keys expire (PEXPIREAT) at their latest deadline: nothing outlives the
-- waiting. A "join" that finds the lock free while another ticket is first
-- PUBLISHes that ticket on the channel (its owner may have missed the
-- release's message); so does a "leave" that hands the first place on.
-- Everything is checked before the first write: arguments, the types of the
-- line's keys (sorted sets or absent) and the counters (canonical decimals
-- in [1, 2^63-2]); otherwise an error naming the key, nothing written.
--
-- Example: free lock, empty line, counter 41, token "ab..", "join": {1,
-- "42"}. Then "cd.." joins: {0, 29998, 1}; "ef.." joins: {0, 29997, 2}.
-- "ab.." releases (fence/release PUBLISHes "cd.."); "ef.." calls first:
-- {0, -2, 2} (and PUBLISHes "cd.."); "cd.." calls: {1, "43"}.

--@include lib/fail
--@include lib/decimal
--@include lib/queue

local token = ARGV[1]
if token == nil or token == '' then
  return fail('empty token')
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl % 1 ~= 0 or ttl < 1 or ttl > 9007199254740991 then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end
local mode = ARGV[3]
if mode ~= 'join' and mode ~= 'try' and mode ~= 'leave' then
  return fail('bad mode: ' .. tostring(mode))
end
local life
if mode == 'join' then
  life = tonumber(ARGV[4])
  if not life or life % 1 ~= 0 or life < 1 or life > 9007199254740991 then
    return fail('bad life: ' .. tostring(ARGV[4]))
  end
end
if string.sub(KEYS[2], -6) ~= ':queue' then
  return fail('not a queue: ' .. KEYS[2])
end
for i = 2, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'zset' and kind ~= 'none' then
    return fail(KEYS[i] .. ': waiting line holds a ' .. kind .. ', not a sorted set')
  end
end
local top = '0'
for i = 4, 5 do
  if KEYS[i] then
    local counter = redis.call('GET', KEYS[i])
    if counter then
      if not dec_canonical(counter, '9223372036854775806') then
        return fail(KEYS[i] .. ': fence counter holds a non-counter value (or is at its limit)')
      end
      if dec_less(top, counter) then
        top = counter
      end
    end
  end
end

local holder = redis.call('GET', KEYS[1])
if holder then
  local held, owner = string.match(holder, '^(%d+):(.*)$')
  if owner == token and mode ~= 'leave' then
    -- Our own earlier grant (a lost reply): its fence, as stored.
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('ZREM', KEYS[2], token)
    redis.call('ZREM', KEYS[3], token)
    return {1, held}
  end
end

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local channel = string.sub(KEYS[2], 1, -6) .. 'released'

if mode == 'leave' then
  redis.call('ZREM', KEYS[2], token)
  redis.call('ZREM', KEYS[3], token)
  if not holder then
    local head = queue_head(KEYS[2], KEYS[3], now_ms)
    if head then
      redis.pcall('PUBLISH', channel, head)
    end
  end
  return {0, holder and redis.call('PTTL', KEYS[1]) or -2, 0}
end

local head = queue_head(KEYS[2], KEYS[3], now_ms)
if not holder and (head == nil or head == token) then
  local h, nines = string.match('0' .. top, '^(.-)(9*)$')
  local fence = string.sub(h, 1, -2) .. string.char(string.byte(h, -1) + 1)
    .. string.rep('0', #nines)
  fence = string.match(fence, '^0*(.*)$')
  redis.call('SET', KEYS[1], fence .. ':' .. token, 'PX', ttl)
  redis.call('SET', KEYS[4], fence)
  if head then
    redis.call('ZREM', KEYS[2], token)
    redis.call('ZREM', KEYS[3], token)
  end
  return {1, fence}
end

local position = 0
if mode == 'join' then
  if not redis.call('ZSCORE', KEYS[2], token) then
    local arrival = now_us
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
    if last and tonumber(last) >= arrival then
      arrival = tonumber(last) + 1
    end
    redis.call('ZADD', KEYS[2], arrival, token)
  end
  redis.call('ZADD', KEYS[3], now_ms + life, token)
  local latest = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIREAT', KEYS[2], latest)
  redis.call('PEXPIREAT', KEYS[3], latest)
  position = redis.call('ZRANK', KEYS[2], token) + 1
  if not holder and head then
    redis.pcall('PUBLISH', channel, head)
  end
end
return {0, holder and redis.call('PTTL', KEYS[1]) or -2, position}
