-- lib/rate: how every rate check starts: its arguments' count, its cost and
-- the server clock.
--
-- rate_begin() -> n, cost, now, adopt: the number of limits (#KEYS, with
-- 1 + 2n arguments, or 2 + 2n when the last is "adopt": lib/tag), ARGV[1]
-- as the cost (an integer in [1, 2^53 - 1], as lib/args checks it), TIME as
-- integer microseconds since the epoch (as lib/time reads it) and whether
-- the call adopts a state of other numbers; or nil and the message to fail
-- with. One helper for the whole prologue: each costs a closure and a call
-- per check.

local function rate_begin()
  local n = #KEYS
  local adopt = #ARGV == 2 + 2 * n and ARGV[2 + 2 * n] == 'adopt'
  if n < 1 or (#ARGV ~= 1 + 2 * n and not adopt) then
    return nil, 'expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys'
  end
  local cost = tonumber(ARGV[1])
  if not cost or cost % 1 ~= 0 or cost < 1 or cost > 9007199254740991 then
    return nil, 'bad cost: ' .. tostring(ARGV[1])
  end
  local time = redis.call('TIME')
  -- TIME's digits convert in the arithmetic itself: no tonumber calls.
  return n, cost, time[1] * 1000000 + time[2], adopt
end
