-- fence/write: store a value in a fenced resource, unless a newer holder wrote it.
--
-- KEYS[1]  the resource: a hash with two fields,
--            value  the protected value (any bytes)
--            fence  the fence of the grant that last wrote it, a decimal string
-- ARGV[1]  fence  the writer's fence: a decimal u64 without leading zeros,
--                 1 <= fence <= 2^64-1, compared exactly (as digits, not as
--                 Lua doubles, which would merge neighbours above 2^53).
-- ARGV[2]  value  the bytes to store.
--
-- Reply: {applied, fence}
--   applied = 1: the value was stored with ARGV[1]; fence is ARGV[1].
--   applied = 0: the resource carries a greater fence: a newer grant has
--                written, so this writer's lease is over. fence is the stored
--                one. Nothing was written.
--
-- An EQUAL fence is accepted: one grant may write several times (a multi-step
-- update, or a retry after a lost reply), and only the holder of that grant
-- knows its fence. A smaller fence never is.
--
-- Guarantees: compare and write in one atomic step, checked before the first
-- write; the value and its fence are always written together. A key of another
-- type, or a hash whose fence field is not a canonical decimal, is an error
-- and is left untouched.
--
-- Example: resource {value "a", fence "7"}: write 7 "b" gives {1, "7"};
-- write 9 "c" gives {1, "9"}; then write 8 "d" gives {0, "9"}.

-- Compare two canonical decimals digit by digit (string '<' would use the
-- server's collation locale).
local function dec_less(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return false
end

local function is_fence(s)
  return type(s) == 'string' and #s >= 1 and #s <= 20 and s:match('^[1-9][0-9]*$') ~= nil
    and not dec_less('18446744073709551615', s)
end

local fence = ARGV[1]
if not is_fence(fence) then
  return redis.error_reply('ERR nolock fence/write: bad fence: ' .. tostring(fence))
end
if ARGV[2] == nil then
  return redis.error_reply('ERR nolock fence/write: missing value')
end

local stored = redis.call('HGET', KEYS[1], 'fence')
if stored then
  if not is_fence(stored) then
    return redis.error_reply('ERR nolock fence/write: resource holds a non-fence value')
  end
  if dec_less(fence, stored) then
    return {0, stored}
  end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('ERR nolock fence/write: resource hash has no fence field')
end

redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', fence)
return {1, fence}
