-- lib/int64: exact 64-bit signed integers in Lua 5.1, whose numbers are
-- doubles (exact only up to 2^53).
--
-- A value is two limbs {hi, lo} meaning hi * 10^9 + lo with 0 <= lo < 10^9.
-- Both limbs stay far below 2^53, so parsing and comparing are exact.
-- parse(s) -> the value of a canonical decimal integer (what INCRBY accepts
-- and writes: no sign on zero, no leading zeros, no '+') within the i64
-- range, else nil. less(a, b) -> a < b.

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
