#!lua flags=allow-oom
-- fence/release_fair: fence/release for a fair lock's grant (fence/acquire_fair):
-- delete the lock, only if it still holds the caller's token, and wake the
-- first in its waiting line by name. fence/release without the line, so a
-- plain release pays nothing for fair locks.
--
-- KEYS[1]  the lock written by fence/acquire.
-- KEYS[2]  the waiting flag fence/acquire sets for waiters, a
--          name ending in ":waiting" (nolock sends
--          `keys::derive(resource, "waiting")`). Same hash tag as KEYS[1].
--          Only its existence is read. The release is announced on the
--          pub/sub channel of the same name ending in ":released" instead
--          (`keys::derive(resource, "released")`): derived here, not sent,
--          as an argument costs more than the few characters.
-- KEYS[3]  the waiting line of fence/acquire_fair
--          (`keys::derive(resource, "queue")`), and
-- KEYS[4]  its deadlines (`keys::derive(resource, "queue:alive")`): a fair
--          lock's grant sends them. After the DEL, dead tickets are dropped
--          and the first live one is PUBLISHed on the channel, so the
--          release wakes the waiter whose turn it is, not any waiter.
-- ARGV[1]  holder   the lock value of the grant being released,
--                   "<fence>:<token>" as fence/acquire stored it.
--
-- Reply: {released}
--   1  the lock held ARGV[1] and was deleted; "1" was PUBLISHed on the
--      channel if the waiting flag exists, and the first ticket of the
--      line (KEYS[3]) if there is one
--   0  the lock is gone or held under another token (it expired and someone
--      else may hold it now); nothing was written or published
--
-- Guarantees: never deletes a lock taken by someone else, however late the
-- call arrives. The fence counter and the waiting flag are left alone.
-- Declared allow-oom: it only frees memory, so it must still run on a
-- server that is full. The PUBLISH comes after the DEL and cannot fail in a
-- way that undoes it (redis.pcall): a lost announcement only makes waiters
-- sleep until their fallback timer.
--
-- Why a release without the flag wakes nobody who waits: a waiter
-- subscribes to the channel before its first attempt, and every attempt
-- that finds the lock held sets the flag, in the same atomic step, for at
-- least as long as the waiter then sleeps. A release after that attempt
-- sees the flag; a release before it left the lock free for it. The flag is
-- not deleted here: other waiters may still sleep on it (each process wakes
-- one waiter per message), and it expires on its own.
-- Without waiters, the EXISTS replaces the PUBLISH, which a cluster would
-- also broadcast to every node (on one server the two cost about the same).
--
-- Example: lock = "7:ab..", flag present: release "7:ab.." gives {1} and
-- one message on the channel; again gives {0}. Flag absent: {1}, no message.
-- With KEYS[3..4] and the line {cd..=1, ef..=2}, both alive: {1}, and
-- "cd.." on the channel.

--@include lib/fail
--@include lib/queue

local holder = ARGV[1]
if holder == nil or holder == '' then
  return fail('empty holder')
end
if KEYS[2] and string.sub(KEYS[2], -8) ~= ':waiting' then
  return fail('not a waiting flag: ' .. KEYS[2])
end
if not KEYS[4] or string.sub(KEYS[3], -6) ~= ':queue' then
  return fail('not a queue: ' .. tostring(KEYS[3]))
end
if redis.call('GET', KEYS[1]) == holder then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
    redis.pcall('PUBLISH', string.sub(KEYS[2], 1, -8) .. 'released', '1')
  end
  -- A line of another type (foreign data) is left alone: the lock is freed
  -- all the same, and its waiters fall back to their timers.
  if redis.call('TYPE', KEYS[3])['ok'] == 'zset'
      and redis.call('TYPE', KEYS[4])['ok'] == 'zset' then
    local time = redis.call('TIME')
    local head = queue_head(KEYS[3], KEYS[4],
      tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
    if head then
      redis.pcall('PUBLISH', string.sub(KEYS[2], 1, -8) .. 'released', head)
    end
  end
  return {1}
end
return {0}
