#!lua flags=no-writes
-- fence/read: read a fenced resource written by fence/write.
--
-- KEYS[1]  the resource hash {value, fence}.
--
-- Reply: {value, fence}
--   value  the stored bytes; false (nil) when the resource does not exist
--   fence  the fence of the grant that wrote it, a decimal string; "0" when
--          the resource does not exist
--
-- Read-only (flags=no-writes), so it runs with EVALSHA_RO and replicas accept it.

local fields = redis.call('HMGET', KEYS[1], 'value', 'fence')
if not fields[1] and not fields[2] then
  return {false, '0'}
end
if not fields[1] or not fields[2] then
  return redis.error_reply('ERR nolock fence/read: resource hash lacks its value or fence field')
end
return {fields[1], fields[2]}
