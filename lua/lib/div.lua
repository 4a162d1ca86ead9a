-- lib/div: exact integer division of non-negative integers below 2^53.
--
-- floor_div(a, b) -> floor(a / b); ceil_div(a, b) -> ceil(a / b), b >= 1.
-- The double quotient a / b may round across an integer; one correction
-- step each way makes the result exact.

local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function ceil_div(a, b)
  return floor_div(a + b - 1, b)
end
