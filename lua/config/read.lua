#!lua flags=no-writes
-- config/read: read the registry of named configurations, whole, one field, or only when it changed.
--
-- KEYS[1]  the registry hash (see config/put).
-- KEYS[2]  the registry's epoch (see config/put); missing is 0.
-- ARGV[1]  what to read:
--            "all"          every field
--            "field:<f>"    the field <f> alone
--            "since:<e>"    every field, unless the epoch is still <e>
--                           (then nothing: the poll of every process)
--
-- Reply: {epoch, field1, value1, field2, value2, ...}: the epoch, then the
-- fields read with their values ("field:" answers one pair, or none when
-- the field is missing).
--
-- Guarantees: writes nothing (flags=no-writes: a replica may serve it). An
-- epoch key that is not a canonical integer, or a registry key of another
-- type, is foreign data: a definite error naming the key.
--
-- Example: ARGV = {"since:7"} when the epoch is 7: {7}; when it is 8:
-- {8, "counter:api", "8 1796450195314 {...}", ...}.

--@include lib/fail
--@include lib/stored

if #KEYS ~= 2 or #ARGV ~= 1 then
  return fail('expected 2 keys and 1 argument, got ' .. #KEYS .. ' and ' .. #ARGV)
end
local epoch = 0
local raw = redis.call('GET', KEYS[2])
if raw then
  epoch = stored_int(raw, 0, 9007199254740991)
  if not epoch then return fail('key ' .. KEYS[2] .. ' does not hold an epoch') end
end
local what = ARGV[1]
local since = string.match(what, '^since:(%d+)$')
if since and stored_int(since, 0, 9007199254740991) == epoch then return {epoch} end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return fail('key ' .. KEYS[1] .. ' holds a ' .. kind .. ', not the registry hash')
end
local field = string.match(what, '^field:(.+)$')
if field then
  local value = redis.call('HGET', KEYS[1], field)
  if value then return {epoch, field, value} end
  return {epoch}
end
if what ~= 'all' and not since then return fail('bad argument ' .. what) end
local reply = redis.call('HGETALL', KEYS[1])
table.insert(reply, 1, epoch)
return reply
