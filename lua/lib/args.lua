-- lib/args: integer arguments, as the typed Rust wrappers send them.
--
-- arg_int(i, min, max) -> ARGV[i] as an integer in [min, max], or nil.
-- max must be at most 2^53 - 1, where doubles stop being exact: a larger
-- argument then fails the range check instead of being rounded into it.
-- `v % 1 ~= 0` refuses fractions, and NaN and infinities too (their
-- remainder is NaN), for less than math.floor costs.

local function arg_int(i, min, max)
  local v = tonumber(ARGV[i])
  if not v or v % 1 ~= 0 or v < min or v > max then return nil end
  return v
end
