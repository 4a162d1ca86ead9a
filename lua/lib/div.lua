-- lib/div: exact integer division of integers below 2^53.
--
-- floor_div(a, b) -> floor(a / b); ceil_div(a, b) -> ceil(a / b), for
-- integers |a| < 2^53 and b >= 1.
--
-- The rounded double quotient is enough: when a / b is an integer it is
-- exact (it is at most |a| < 2^53); otherwise it lies at least 1/b from
-- either integer neighbour, and rounding moves it by at most
-- |a / b| x 2^-53 < 1/b, so it stays strictly between them. Hot scripts
-- write math.floor(a / b) in place (a call costs more than the division);
-- every such place keeps |a| < 2^53.

local function floor_div(a, b)
  return math.floor(a / b)
end

local function ceil_div(a, b)
  return math.ceil(a / b)
end
