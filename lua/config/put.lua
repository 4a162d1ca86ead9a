-- config/put: store one named configuration in the registry, numbered by the registry's epoch.
--
-- KEYS[1]  the registry: a hash, one field per named configuration
--          ("<family>:<name>", e.g. "rate-limit:api"), each value
--          "<epoch> <changed_ms> <body>": the epoch this version got, the
--          server time it was written (integer milliseconds since the Unix
--          epoch) and the body the client sent (JSON, opaque here).
-- KEYS[2]  the registry's epoch: a canonical integer, the epoch of the
--          latest write to any field. Missing is 0. Processes poll it (one
--          GET) and read the registry again only when it moved.
-- ARGV[1]  the field.
-- ARGV[2]  the body, 1 to 65536 bytes.
-- ARGV[3]  when to write:
--            "create"  only when the field is missing (the first process
--                      that names a configuration creates it)
--            "<epoch>" only when the field holds exactly that epoch (a
--                      change made from what the caller read; 0: missing)
--
-- Reply: {written, value}: written is 1 when this call stored the body, 0
-- when the condition did not hold; value is the field's value after the
-- call (false when missing).
--
-- Guarantees: the epoch key and the field's value are checked before the
-- first write; either in another form is foreign data: a definite error,
-- nothing written. Every write gets a new epoch, so epochs never repeat and
-- a process that saw epoch e has seen every write up to e.
--
-- Example: ARGV = {"counter:api", '{"spec":..}', "create"} on an empty
-- registry: the epoch becomes 1, the field "1 1796450195314 {"spec":..}",
-- and the reply is {1, "1 1796450195314 {"spec":..}"}.

--@include lib/fail
--@include lib/stored

local MAX = 9007199254740991
if #KEYS ~= 2 or #ARGV ~= 3 then
  return fail('expected 2 keys and 3 arguments, got ' .. #KEYS .. ' and ' .. #ARGV)
end
local field, body, when = ARGV[1], ARGV[2], ARGV[3]
if #field < 3 or #field > 128 or not string.find(field, '^[a-z-]+:[%w][%w_.-]*$') then
  return fail('bad field ' .. field)
end
if #body < 1 or #body > 65536 then return fail('the body has 1 to 65536 bytes') end
local expected = nil
if when ~= 'create' then
  expected = stored_int(when, 0, MAX)
  if not expected then return fail('bad condition ' .. when) end
end

local raw_epoch = redis.call('GET', KEYS[2])
local epoch = 0
if raw_epoch then
  epoch = stored_int(raw_epoch, 0, MAX - 1)
  if not epoch then return fail('key ' .. KEYS[2] .. ' does not hold an epoch') end
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return fail('key ' .. KEYS[1] .. ' holds a ' .. kind .. ', not the registry hash')
end
local old = redis.call('HGET', KEYS[1], field)
local old_epoch = 0
if old then
  local digits = string.match(old, '^(%d+) %d+ .')
  old_epoch = digits and stored_int(digits, 1, MAX)
  if not old_epoch then
    return fail('field ' .. field .. ' of key ' .. KEYS[1] .. ' does not hold a configuration')
  end
end

if (expected == nil and old) or (expected ~= nil and expected ~= old_epoch) then
  return {0, old or false}
end

local time = redis.call('TIME')
local ms = math.floor((time[1] * 1000000 + time[2]) / 1000)
epoch = epoch + 1
local value = epoch .. ' ' .. ms .. ' ' .. body
redis.call('SET', KEYS[2], epoch)
redis.call('HSET', KEYS[1], field, value)
return {1, value}
