#!lua flags=no-writes
-- cas/get_versioned: read a versioned value and its version.
--
-- KEYS[1]  a hash written by cas/set_if_version, with two fields:
--            v    the value (bytes; the Rust API stores JSON)
--            ver  its version: a decimal integer, 1 after the first write,
--                 +1 on every write after that
--
-- Reply: {version, value}
--   version  decimal string: the stored version, "0" when the key does not exist
--   value    bytes: the stored value, nil when the key does not exist
--
-- Read-only (flags=no-writes), so it runs with EVALSHA_RO and replicas accept
-- it. A key of another type fails with WRONGTYPE; a hash without both fields
-- is an error (it was not written by cas/set_if_version).
--
-- Example: after two writes of "a" then "b":  {"2", "b"}.  Missing key: {"0", nil}.

local fields = redis.call('HMGET', KEYS[1], 'ver', 'v')
local version, value = fields[1], fields[2]
if not version and not value and redis.call('EXISTS', KEYS[1]) == 0 then
  return {'0', false}
end
if not version or not value or not string.match(version, '^[1-9]%d*$') then
  return redis.error_reply('ERR nolock cas/get_versioned: the hash is not a nolock versioned value')
end
return {version, value}
