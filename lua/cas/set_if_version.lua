-- cas/set_if_version: write a versioned value only if its version is unchanged.
--
-- KEYS[1]  a hash with fields v (the value, bytes) and ver (its version, a
--          decimal integer); see cas/get_versioned. Absent means version 0.
-- ARGV[1]  expected  decimal integer, 0 <= expected <= 2^63-1: the version the
--                    caller read; "0" requires that the key does not exist.
-- ARGV[2]  value     bytes: the new value.
--
-- Reply: {1, version}         written; version is the new version, expected + 1;
--        {0, version, value}  conflict, nothing written: the stored version
--                             ("0" when the key does not exist) and value (nil
--                             when the key does not exist);
--        {-1, version}        the stored version is 2^63-1 and cannot rise:
--                             nothing written.
-- Versions are decimal strings, exact beyond 2^53 (Lua numbers are doubles,
-- so versions are compared as strings and raised with HINCRBY).
--
-- Guarantees: compare and write are one atomic step, so of any number of
-- writers that read the same version exactly one succeeds. Every successful
-- write raises the version by exactly one. The key's expiry, if someone set
-- one, is kept. A key of another type fails with WRONGTYPE; a hash without
-- both fields is an error; neither writes anything.
--
-- Example: missing key.     ARGV {"0", "a"}  -> {1, "1"}
--                           ARGV {"1", "b"}  -> {1, "2"}
--                           ARGV {"1", "c"}  -> {0, "2", "b"}

if #ARGV ~= 2 or not string.match(ARGV[1], '^%d+$') then
  return redis.error_reply('ERR nolock cas/set_if_version: bad arguments')
end

local fields = redis.call('HMGET', KEYS[1], 'ver', 'v')
local version, value = fields[1], fields[2]
if not version and not value and redis.call('EXISTS', KEYS[1]) == 0 then
  version = '0'
elseif not version or not value or not string.match(version, '^[1-9]%d*$') then
  return redis.error_reply('ERR nolock cas/set_if_version: the hash is not a nolock versioned value')
end

if version ~= ARGV[1] then
  return {0, version, value}
end
if version == '9223372036854775807' then
  return {-1, version}
end

redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HSET', KEYS[1], 'v', ARGV[2])
return {1, redis.call('HGET', KEYS[1], 'ver')}
