-- lib/calendar: a calendar limit's arguments and the period the server's
-- clock is in.
--
-- A calendar limit takes six numbers (rate/calendar/*): its tag number h
-- (the client's hash of the period's definition, 0 <= h < 2^32), its
-- limit L (1 <= L <= 2^53 - 1), and four boundaries b0 < b1 < b2 < b3 (ms
-- since the epoch): the starts of three consecutive periods and the end of
-- the last, which the client computed around its best estimate of the
-- server's time (the zone's rules live in the client, never here).
--
-- calendar_args(j) -> h, L, b: the limit whose numbers start at ARGV[j],
-- with b = {b0, b1, b2, b3}; nil when any is not as above.
-- calendar_end(b, now) -> the end of the period holding now (b[k] <= now
-- < b[k + 1]), or nil when now is before b0 or at or after b3: the client's
-- estimate was off by more than a period, and the call is refused
-- (calendar_refuse) rather than counted in a period the server is not in.
-- calendar_refuse(key, now) -> the NOLOCK_PERIOD error reply, which
-- carries the server's time so the client can build the call again.
--
-- Example: calendar_end({0, 1000, 2000, 3000}, 1500) -> 2000;
-- calendar_end({0, 1000, 2000, 3000}, 3000) -> nil.

local function calendar_args(j)
  local h, l = arg_int(j, 0, 4294967295), arg_int(j + 1, 1, 9007199254740991)
  if not h or not l then return nil end
  local b = {}
  for k = 1, 4 do
    b[k] = arg_int(j + 1 + k, 0, 9007199254740991)
    if not b[k] or (k > 1 and b[k] <= b[k - 1]) then return nil end
  end
  return h, l, b
end

local function calendar_end(b, now)
  if now < b[1] or now >= b[4] then return nil end
  if now < b[2] then return b[2] end
  if now < b[3] then return b[3] end
  return b[4]
end

local function calendar_refuse(key, now)
  return redis.error_reply('NOLOCK_PERIOD nolock ' .. SCRIPT_NAME .. ': the server time '
    .. string.format('%d', now) .. ' ms is outside the periods sent for ' .. key
    .. '; nothing was written')
end
