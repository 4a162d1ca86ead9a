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

--@include lib/fail
--@include lib/decimal

local fields = redis.call('HMGET', KEYS[1], 'value', 'fence')
if not fields[1] and not fields[2] then
  return {false, '0'}
end
if not fields[1] or not fields[2] then
  return fail(KEYS[1] .. ' lacks its value or fence field')
end
if not dec_canonical(fields[2], U64_MAX) then
  return fail(KEYS[1] .. ' holds a non-fence value')
end
return {fields[1], fields[2]}
