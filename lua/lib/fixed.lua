-- lib/fixed: a fixed window's counter, read strictly.
--
-- fixed_read(key, now) -> count, end: the units counted at key (a canonical
-- integer, as INCRBY writes it) and its window's end in ms since the epoch
-- (PEXPIRETIME; -1 when something removed the expiry). A missing key, or a
-- window that has ended by now (compared with TIME: Redis keeps a key
-- through the millisecond its expiry names), is (0, nil). nil when the key
-- holds anything else; a key of another type raises WRONGTYPE.

--@include lib/stored

local function fixed_read(key, now)
  local stored = redis.call('GET', key)
  if not stored then return 0, nil end
  local c = stored_int(stored, 0, 9007199254740991)
  if not c then return nil end
  local e = redis.call('PEXPIRETIME', key)
  if e >= 0 and now >= e then return 0, nil end
  return c, e
end
