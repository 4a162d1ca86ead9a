#!lua flags=allow-oom
-- fence/release: delete a lock, only if it still holds the caller's token.
--
-- KEYS[1]  the lock written by fence/acquire.
-- ARGV[1]  token  the owner token of the grant being released.
--
-- Reply: {released}
--   1  the lock held ARGV[1] and was deleted
--   0  the lock is gone or held under another token (it expired and someone
--      else may hold it now); nothing was written
--
-- Guarantees: never deletes a lock taken by someone else, however late the
-- call arrives. The fence counter is left alone. Declared allow-oom: it only
-- frees memory, so it must still run on a server that is full.
--
-- Example: lock = "ab..": release "ab.." gives {1}; again gives {0}.

local token = ARGV[1]
if token == nil or token == '' then
  return redis.error_reply('ERR nolock fence/release: empty token')
end
if redis.call('GET', KEYS[1]) == token then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}
