-- lib/gcra: a GCRA limit's state, read strictly.
--
-- gcra_tat(key, now) -> max(TAT, now): the theoretical arrival time stored at
-- key (integer microseconds since the epoch, server clock), or now when the
-- key is missing or its TAT has passed; nil when the key holds anything but
-- a TAT nolock could have written (a canonical integer no later than now +
-- 2^51 us). A key of another type raises WRONGTYPE before any write.

--@include lib/stored

local function gcra_tat(key, now)
  local stored = redis.call('GET', key)
  if not stored then return now end
  local tat = stored_int(stored, 0, now + 2251799813685248)
  if not tat then return nil end
  if tat > now then return tat end
  return now
end
