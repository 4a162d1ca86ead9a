#!lua flags=allow-oom
-- cas/compare_and_delete: delete a key only if it still holds the expected value.
--
-- KEYS[1]  a string key.
-- ARGV[1]  expected  bytes: the value the key must hold, compared byte for byte.
--
-- Reply: {1}           the key held `expected` and was deleted;
--        {0, current}  nothing was deleted; current is the value found, or nil
--                      when the key does not exist (expired or deleted).
--
-- Guarantees: the comparison and the delete are one atomic step, so a caller
-- can never delete a value that someone else wrote after its own expired:
-- the safe release of a token-held key. allow-oom: it runs, and frees
-- memory, on a server that is out of memory.
--
-- Example: key holds "token-1".  ARGV {"token-1"}  -> {1}  (key gone)
--                                ARGV {"token-1"}  -> {0, nil}
-- Key holds "token-2".           ARGV {"token-1"}  -> {0, "token-2"}

if #ARGV ~= 1 then
  return redis.error_reply('ERR nolock cas/compare_and_delete: expected 1 argument, got ' .. #ARGV)
end

local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {0, current}
end
redis.call('DEL', KEYS[1])
return {1}
