-- cas/adjust: add a signed delta to an integer balance, only if the result
-- stays within bounds; nothing is written otherwise.
--
-- KEYS[1]  the balance: a decimal 64-bit signed integer string (what INCRBY
--          writes). A missing key is a balance of 0.
-- ARGV[1]  delta    decimal i64: the change. Negative: a debit; positive: a credit;
--                   0: read the balance, write nothing.
-- ARGV[2]  floor    decimal i64: a negative delta applies only if the new
--                   balance is >= floor (e.g. "0": no overdraft).
-- ARGV[3]  ceiling  decimal i64, >= floor: a positive delta applies only if
--                   the new balance is <= ceiling.
-- Only the bound the delta moves towards is checked, so a balance that is
-- already outside the bounds (set by other means) can still move back.
--
-- Reply: {status, balance}
--   status   1  applied: balance is the new balance
--            0  refused by the bound: balance is the current one, unchanged
--           -1  the new balance would leave the i64 range (whatever the
--               bounds): nothing written, balance is the current one
--   balance  decimal string, exact over the whole i64 range
--
-- Guarantees: read, check and write are one atomic step: concurrent debits
-- never take the balance below floor, concurrent credits never above
-- ceiling. Arithmetic is exact 64-bit (see lua/lib/int64.lua), never wraps and
-- never rounds. The write is INCRBY, which keeps the key's expiry and
-- creates a missing key (with no expiry). A refused or failed call writes
-- nothing; a stored non-integer is an error and is left alone.
--
-- Example: balance "10", floor "0", ceiling "100":
--   delta "-7"  -> {1, "3"}    delta "-7" -> {0, "3"}   delta "97" -> {1, "100"}
--   delta "1"   -> {0, "100"}
-- Balance "9223372036854775800", ceiling "9223372036854775807":
--   delta "10"  -> {-1, "9223372036854775800"}

--@include lib/int64

-- Exact sum of two int64 values (it may leave the i64 range; check with less).
local function add(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= LIMB then
    hi, lo = hi + 1, lo - LIMB
  end
  return {hi, lo}
end

-- The canonical decimal form of an int64 value.
local function format(x)
  local hi, lo = x[1], x[2]
  local sign = ''
  if hi < 0 then
    sign, hi, lo = '-', -hi, -lo
    if lo < 0 then
      hi, lo = hi - 1, lo + LIMB
    end
  end
  if hi == 0 then
    return sign .. string.format('%d', lo)
  end
  return sign .. string.format('%.0f%09d', hi, lo)
end

local delta, floor, ceiling = parse(ARGV[1]), parse(ARGV[2]), parse(ARGV[3])
if #ARGV ~= 3 or not delta or not floor or not ceiling or less(ceiling, floor) then
  return redis.error_reply('ERR nolock cas/adjust: bad arguments')
end

local stored = redis.call('GET', KEYS[1])
local balance = {0, 0}
if stored then
  balance = parse(stored)
  if not balance then
    return redis.error_reply('ERR nolock cas/adjust: the key does not hold a 64-bit integer')
  end
end

local zero = {0, 0}
local new = add(balance, delta)
if less(new, I64_MIN) or less(I64_MAX, new) then
  return {-1, format(balance)}
end
if (less(delta, zero) and less(new, floor)) or (less(zero, delta) and less(ceiling, new)) then
  return {0, format(balance)}
end
if less(delta, zero) or less(zero, delta) then
  redis.call('INCRBY', KEYS[1], ARGV[1])
end
return {1, format(new)}
