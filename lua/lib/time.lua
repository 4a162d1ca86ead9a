-- lib/time: the server clock, the only clock a nolock decision reads.
--
-- now_us() -> TIME as integer microseconds since the Unix epoch (about
-- 2^50.5 today: exact as a double).

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
