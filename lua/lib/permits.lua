-- lib/permits: semaphore members (lua/semaphore/*) in the one form nolock writes.
--
-- permit_id(s) -> true when s is a permit id: exactly 32 lowercase hex digits.
-- permit_member(m) -> true when m is "<id>:<i>": a permit id, ':', and i, a
-- canonical integer 1..10000 (the holder's i-th permit). Anything else
-- (another program's member, an uppercase id, "id:0", "id:01") -> false.
--
-- Example: permit_member('0123456789abcdef0123456789abcdef:2') -> true;
-- permit_member('worker-1') -> false.

local function permit_id(s)
  return type(s) == 'string' and #s == 32 and string.find(s, '^[0-9a-f]+$') ~= nil
end

local function permit_member(m)
  if type(m) ~= 'string' then return false end
  local id, i = string.match(m, '^(.*):([1-9]%d?%d?%d?%d?)$')
  return id ~= nil and permit_id(id) and tonumber(i) <= 10000
end
