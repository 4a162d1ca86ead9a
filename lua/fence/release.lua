#!lua flags=allow-oom
-- fence/release: delete a lock, only if it still holds the caller's token,
-- and tell the waiters.
--
-- KEYS[1]  the lock written by fence/acquire.
-- ARGV[1]  holder   the lock value of the grant being released,
--                   "<fence>:<token>" as fence/acquire stored it.
-- ARGV[2]  channel  optional: the pub/sub channel on which to announce the
--                   release (nolock sends `keys::derive(resource, "released")`).
--
-- Reply: {released}
--   1  the lock held ARGV[1] and was deleted; "1" was PUBLISHed on ARGV[2]
--   0  the lock is gone or held under another token (it expired and someone
--      else may hold it now); nothing was written or published
--
-- Guarantees: never deletes a lock taken by someone else, however late the
-- call arrives. The fence counter is left alone. Declared allow-oom: it only
-- frees memory, so it must still run on a server that is full. The PUBLISH
-- comes after the DEL and cannot fail in a way that undoes it (redis.pcall):
-- a lost announcement only makes waiters sleep until their fallback timer.
--
-- Example: lock = "7:ab..": release "7:ab.." gives {1} and one message on the
-- channel; again gives {0}.

--@include lib/fail

local holder = ARGV[1]
if holder == nil or holder == '' then
  return fail('empty holder')
end
if redis.call('GET', KEYS[1]) == holder then
  redis.call('DEL', KEYS[1])
  if ARGV[2] then
    redis.pcall('PUBLISH', ARGV[2], '1')
  end
  return {1}
end
return {0}
