#!lua flags=allow-oom
-- fence/release: delete a lock, only if it still holds the caller's token,
-- and wake the waiters, if any.
--
-- KEYS[1]  the lock written by fence/acquire.
-- KEYS[2]  optional: the waiting flag fence/acquire sets for waiters, a
--          name ending in ":waiting" (nolock sends
--          `keys::derive(resource, "waiting")`). Same hash tag as KEYS[1].
--          Only its existence is read. The release is announced on the
--          pub/sub channel of the same name ending in ":released" instead
--          (`keys::derive(resource, "released")`): derived here, not sent,
--          as an argument costs more than the few characters.
-- ARGV[1]  holder   the lock value of the grant being released,
--                   "<fence>:<token>" as fence/acquire stored it.
--
-- Reply: {released}
--   1  the lock held ARGV[1] and was deleted; "1" was PUBLISHed on the
--      channel if the waiting flag exists
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

--@include lib/fail

local holder = ARGV[1]
if holder == nil or holder == '' then
  return fail('empty holder')
end
if KEYS[2] and string.sub(KEYS[2], -8) ~= ':waiting' then
  return fail('not a waiting flag: ' .. KEYS[2])
end
if redis.call('GET', KEYS[1]) == holder then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
    redis.pcall('PUBLISH', string.sub(KEYS[2], 1, -8) .. 'released', '1')
  end
  return {1}
end
return {0}
