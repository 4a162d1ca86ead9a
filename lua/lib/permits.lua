-- lib/permits: semaphore members (lua/semaphore/*) in the one form nolock writes.
--
-- permit_id(s) -> true when s is a permit id: exactly 32 lowercase hex digits.
-- permit_member(m) -> true when m is "<id>:<i>": a permit id, ':', and i, a
-- canonical integer 1..10000 (the holder's i-th permit). Anything else
-- (another program's member, an uppercase id, "id:0", "id:01") -> false.
--
-- permit_holding(key, id, weight, now) -> how the id holds permits at `key`
-- against `weight` (unexpired: score > now, server ms):
--   'held'    "<id>:1".."<id>:<weight>" are all unexpired, and
--             "<id>:<weight+1>" is absent or expired
--   'none'    "<id>:1" is absent or expired: the id holds nothing (nolock
--             gives all of an id's permits one expiry)
--   'weight'  "<id>:1" is unexpired but the rest does not match: the id was
--             granted another weight (more, or fewer, than `weight`)
-- Reads 1 member when the id holds nothing, at most weight + 1 otherwise.
-- permit_weight_error() -> the error reply for 'weight': code NOLOCK_WEIGHT
-- (Error::PermitWeightMismatch), naming the key and never the id.
--
--
-- permit_bounds(key) -> ok, tag, highest: the semaphore's tag and bounds,
-- read from its lowest members and its highest (the set must exist). The
-- tag member "by:m<P>" (lib/tag: a semaphore of P permits, P a canonical
-- integer 1..10000), scored 0, is below every permit (scores are expiries,
-- >= 1): when rank 0 is that member, tag = "m<P>" and the lowest permit is
-- rank 1, else tag = nil (a set written before tags). The lowest permit
-- and the highest member must be permits scored with integers
-- 1..2^53 - 1, so every permit's score lies between theirs; highest is the
-- highest score, nil when the tag is the only member. ok = false for
-- anything else: another "by:" member or score, a second tag (it sorts
-- above the first, where a permit must be), a foreign member or score.
--
-- Example: permit_member('0123456789abcdef0123456789abcdef:2') -> true;
-- permit_member('worker-1') -> false. Id "ab.." holding 3 unexpired:
-- permit_holding(k, "ab..", 3, now) -> 'held'; with weight 1 or 4 -> 'weight'.
-- {"by:m3" 0, "ab..:1" T}: permit_bounds -> true, 'm3', T.

--@include lib/stored

local function permit_id(s)
  return type(s) == 'string' and #s == 32 and string.find(s, '^[0-9a-f]+$') ~= nil
end

local function permit_member(m)
  if type(m) ~= 'string' then return false end
  local id, i = string.match(m, '^(.*):([1-9]%d?%d?%d?%d?)$')
  return id ~= nil and permit_id(id) and tonumber(i) <= 10000
end

local function permit_holding(key, id, weight, now)
  local function live(i)
    local s = redis.call('ZSCORE', key, id .. ':' .. i)
    return s and tonumber(s) > now
  end
  if not live(1) then return 'none' end
  for i = 2, weight do
    if not live(i) then return 'weight' end
  end
  if live(weight + 1) then return 'weight' end
  return 'held'
end

local function permit_weight_error()
  return redis.error_reply('NOLOCK_WEIGHT nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[1]
    .. ' holds this permit id with another weight; nothing was written')
end

local function permit_bounds(key)
  local low = redis.call('ZRANGE', key, 0, 1, 'WITHSCORES')
  local tag
  local i = 1
  if low[1] and string.sub(low[1], 1, 4) == 'by:m' then
    if low[2] ~= '0' or not stored_int(string.sub(low[1], 5), 1, 10000) then
      return false
    end
    tag = string.sub(low[1], 4)
    i = 3
  end
  if low[i] == nil then return true, tag, nil end
  if not permit_member(low[i]) or not stored_int(low[i + 1], 1, 9007199254740991) then
    return false
  end
  local high = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local highest = stored_int(high[2], 1, 9007199254740991)
  if not permit_member(high[1]) or not highest then return false end
  return true, tag, highest
end
