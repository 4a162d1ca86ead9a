#!lua flags=allow-oom
-- cas/compare_and_expire: set a key's expiry only if it still holds the expected value.
--
-- KEYS[1]  a string key.
-- ARGV[1]  expected  bytes: the value the key must hold, compared byte for byte.
-- ARGV[2]  ttl       integer milliseconds, 1 <= ttl <= 2^53-1: the new time to
--                    live, counted from now (it may shorten or lengthen it).
--
-- Reply: {1}           the key held `expected`; it now expires in ttl ms;
--        {0, current}  nothing changed; current is the value found, or nil
--                      when the key does not exist.
--
-- Guarantees: the comparison and PEXPIRE are one atomic step: extending a
-- lease that has already passed to someone else is impossible. allow-oom:
-- PEXPIRE needs no memory, and extension must work on a full server.
--
-- Example: key holds "token-1" with 2 s left.
--   ARGV {"token-1", 30000}  -> {1}            (30 s left)
--   ARGV {"token-9", 30000}  -> {0, "token-1"} (still the old expiry)

if #ARGV ~= 2 then
  return redis.error_reply('ERR nolock cas/compare_and_expire: expected 2 arguments, got ' .. #ARGV)
end
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 9007199254740991 then
  return redis.error_reply('ERR nolock cas/compare_and_expire: bad ttl: ' .. tostring(ARGV[2]))
end

local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {0, current}
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1}
