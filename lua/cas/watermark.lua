-- cas/watermark: store an integer only if it moves the stored one in one direction.
-- Runs cas::set_if_greater (ARGV[2] = "greater") and cas::set_if_less ("less").
--
-- KEYS[1]  a decimal 64-bit signed integer string. A missing key accepts any value.
-- ARGV[1]  value      decimal i64: the candidate.
-- ARGV[2]  direction  "greater": write when value > stored (a high-water mark);
--                     "less": write when value < stored (a low-water mark).
--
-- Reply: {applied, stored}
--   applied  1 when value was written (the key was missing or value was
--            beyond the stored one in the direction), 0 when the stored value
--            was kept (equal counts as kept)
--   stored   decimal string: the value in the key after the call, exact over
--            the whole i64 range
--
-- Guarantees: compare and write are one atomic step, so the stored value only
-- ever moves one way, however many writers race. The comparison is exact
-- 64-bit (see lua/lib/int64.lua; doubles would call 2^53 and 2^53 + 1 equal). The
-- write is SET KEEPTTL: a key's expiry is kept. A stored non-integer is an
-- error and is left alone.
--
-- Example (high-water mark): missing key.  ARGV {"10", "greater"} -> {1, "10"}
--                                          ARGV {"7", "greater"}  -> {0, "10"}
--                                          ARGV {"12", "greater"} -> {1, "12"}
-- (low-water mark) on that key:            ARGV {"-3", "less"}    -> {1, "-3"}

--@include lib/int64

local value = parse(ARGV[1])
if #ARGV ~= 2 or not value then
  return redis.error_reply('ERR nolock cas/watermark: bad value: ' .. tostring(ARGV[1]))
end
local greater = ARGV[2] == 'greater'
if not greater and ARGV[2] ~= 'less' then
  return redis.error_reply('ERR nolock cas/watermark: bad direction: ' .. tostring(ARGV[2]))
end

local current = redis.call('GET', KEYS[1])
if current then
  local stored = parse(current)
  if not stored then
    return redis.error_reply('ERR nolock cas/watermark: the key does not hold a 64-bit integer')
  end
  local beyond
  if greater then beyond = less(stored, value) else beyond = less(value, stored) end
  if not beyond then
    return {0, current}
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
return {1, ARGV[1]}
