-- lib/decimal: exact comparison of unsigned decimal strings of any length.
--
-- Fences and fence counters reach 2^63 - 1 (counters) and 2^64 - 1 (fences a
-- caller may send), far past 2^53 where Lua numbers (doubles) merge
-- neighbours, so they are kept and compared as digit strings.
--
-- dec_less(a, b) -> a < b, for two canonical decimals (digit by digit: string
-- '<' would use the server's collation locale).
-- dec_canonical(s, max) -> true when s is exactly a canonical decimal in
-- [1, max]: digits only, no sign, no leading zero, no spaces (max canonical).
--
-- Example: dec_less('9', '10') is true; dec_canonical('007', '99') is false;
-- dec_canonical('18446744073709551616', U64_MAX) is false.

local U64_MAX = '18446744073709551615'
local I64_MAX = '9223372036854775807'

local function dec_less(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return false
end

local function dec_canonical(s, max)
  return type(s) == 'string' and #s >= 1 and #s <= #max and s:match('^[1-9][0-9]*$') ~= nil
    and not dec_less(max, s)
end
