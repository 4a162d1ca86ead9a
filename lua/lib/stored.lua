-- lib/stored: stored integers, accepted only in the form nolock writes them.
--
-- stored_int(raw, min, max) -> the integer raw holds, or nil when raw is not
-- exactly a canonical decimal integer: optional '-', no leading zeros, no
-- '+', no spaces, no exponent, no hex, no "-0", at most 16 digits, within
-- [min, max] (|min|, max <= 2^53 - 1). tonumber alone would take " 7", "007",
-- "1e3", "0x10" and "inf", and round values above 2^53.
--
-- Example: "42" -> 42; "-5" -> -5 (when min allows); "042", "4.0", " 4",
-- "99999999999999999999" -> nil.

local function stored_int(raw, min, max)
  if type(raw) ~= 'string' or #raw > 17
    or not (raw == '0' or string.find(raw, '^%-?[1-9]%d*$')) then
    return nil
  end
  -- At most 16 digits: exact, or rounded to >= 2^53 and so above max.
  local v = tonumber(raw)
  if v < min or v > max then return nil end
  return v
end
