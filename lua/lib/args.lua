-- lib/args: integer arguments, as the typed Rust wrappers send them.
--
-- arg_int(i, min, max) -> ARGV[i] as an integer in [min, max], or nil.
-- max must be at most 2^53 - 1, where doubles stop being exact: a larger
-- argument then fails the range check instead of being rounded into it.

local function arg_int(i, min, max)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < min or v > max then return nil end
  return v
end
