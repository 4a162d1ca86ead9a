-- lib/fixed: a fixed window's counter, read strictly.
--
-- fixed_read(key, now, tag, adopt, strict) -> count, end: the units counted
-- at key ("<tag>:<count>" as rate/fixed_window/check writes it, the count a
-- canonical integer; or, unless strict, a bare count written before tags:
-- rate/calendar reads strictly, as no calendar state was ever untagged) and its
-- window's end in ms since the epoch (PEXPIRETIME; -1 when something
-- removed the expiry). A missing key, or a window that has ended by now
-- (compared with TIME: Redis keeps a key through the millisecond its expiry
-- names), is (0, nil). nil, by when the key holds another limit's state,
-- tagged by (lib/tag: tag_same(by, tag, adopt) is false; the caller
-- refuses it); nil when the key holds anything else; a key of another type
-- raises WRONGTYPE.
--
-- Example: on "f1000x5:3" with 400 ms left, fixed_read(k, now, 'f1000x5',
-- false) -> 3, now + 400; fixed_read(k, now, 'f1000x9', false) -> nil,
-- 'f1000x5'; with adopt -> 3, now + 400.

--@include lib/stored
--@include lib/tag

local function fixed_read(key, now, tag, adopt, strict)
  local stored = redis.call('GET', key)
  if not stored then return 0, nil end
  local colon = #stored <= 51 and string.find(stored, ':', 1, true)
  local tagged = false
  if colon then
    local by = string.sub(stored, 1, colon - 1)
    -- A prefix that is no tag leaves the whole value, which is then foreign.
    if string.find(by, '^[a-z]%d+x%d+$') or string.find(by, '^m%d+$') then
      if not tag_same(by, tag, adopt) then return nil, by end
      stored, tagged = string.sub(stored, colon + 1), true
    end
  end
  -- strict: no untagged state was ever written by this limit (one born
  -- with tags): a bare count is another's, foreign.
  if strict and not tagged then return nil end
  local c = stored_int(stored, 0, 9007199254740991)
  if not c then return nil end
  local e = redis.call('PEXPIRETIME', key)
  if e >= 0 and now >= e then return 0, nil end
  return c, e
end
