-- cas/compare_and_set: write a value only if the key holds the expected one
-- (or, with no expected value, only if the key is absent).
--
-- KEYS[1]  a string key.
-- ARGV[1]  new       bytes: the value to store.
-- ARGV[2]  ttl       integer milliseconds, 0 <= ttl <= 2^53-1: with ttl >= 1 the
--                    written value expires after ttl ms; 0 keeps the key's
--                    current expiry (a key created from absent gets none).
-- ARGV[3]  expected  bytes: the value the key must hold, compared byte for
--                    byte. Leave it out (#ARGV == 2) to require that the key
--                    does not exist: insert-if-absent.
--
-- Reply: {1}           the new value was written;
--        {0, current}  nothing was written; current is the value found, or
--                      nil when the key does not exist.
--
-- Guarantees: the read, the comparison and the write are one atomic step. A
-- mismatch writes nothing and leaves the expiry alone. A key of another type
-- fails with WRONGTYPE before anything is written.
--
-- Example: key holds "a".  ARGV {"b", 0, "a"}  -> {1}       (key holds "b")
--                          ARGV {"c", 0, "a"}  -> {0, "b"}
--                          ARGV {"c", 5000}    -> {0, "b"}  (not absent)
-- Key absent:              ARGV {"x", 5000}    -> {1}       (expires in 5 s)

if #ARGV ~= 2 and #ARGV ~= 3 then
  return redis.error_reply('ERR nolock cas/compare_and_set: expected 2 or 3 arguments, got ' .. #ARGV)
end
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl ~= math.floor(ttl) or ttl < 0 or ttl > 9007199254740991 then
  return redis.error_reply('ERR nolock cas/compare_and_set: bad ttl: ' .. tostring(ARGV[2]))
end

local current = redis.call('GET', KEYS[1])
-- GET returns false for a missing key; ARGV[3] is nil when no value is expected.
if current ~= (ARGV[3] or false) then
  return {0, current}
end

if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
end
return {1}
