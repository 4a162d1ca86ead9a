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
-- 64-bit (see int64 below; doubles would call 2^53 and 2^53 + 1 equal). The
-- write is SET KEEPTTL: a key's expiry is kept. A stored non-integer is an
-- error and is left alone.
--
-- Example (high-water mark): missing key.  ARGV {"10", "greater"} -> {1, "10"}
--                                          ARGV {"7", "greater"}  -> {0, "10"}
--                                          ARGV {"12", "greater"} -> {1, "12"}
-- (low-water mark) on that key:            ARGV {"-3", "less"}    -> {1, "-3"}

-- int64: exact 64-bit signed integers in Lua 5.1, whose numbers are doubles
-- (exact only up to 2^53). A value is two limbs {hi, lo} meaning
-- hi * 10^9 + lo with 0 <= lo < 10^9. Both limbs stay far below 2^53, so
-- parsing and comparing (and adding, in cas/adjust) are exact. This block is
-- identical in cas/adjust.lua and cas/watermark.lua (a unit test checks it).
local LIMB = 1000000000
local I64_MIN = {-9223372037, 145224192}
local I64_MAX = {9223372036, 854775807}

local function less(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end

-- A canonical decimal integer (what INCRBY accepts and writes: no sign on
-- zero, no leading zeros, no '+') within the i64 range, else nil.
local function parse(s)
  if type(s) ~= 'string' or not (s == '0' or string.match(s, '^%-?[1-9]%d*$')) then
    return nil
  end
  local negative = string.sub(s, 1, 1) == '-'
  local digits = negative and string.sub(s, 2) or s
  if #digits > 19 then
    return nil
  end
  local hi = tonumber(string.sub(digits, 1, -10)) or 0
  local lo = tonumber(string.sub(digits, -9))
  if negative then
    hi, lo = -hi, -lo
    if lo < 0 then
      hi, lo = hi - 1, lo + LIMB
    end
  end
  local x = {hi, lo}
  if less(x, I64_MIN) or less(I64_MAX, x) then
    return nil
  end
  return x
end
-- end of int64

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
