-- lib/state: a tagged string state of several integers, read strictly.
--
-- state_read(key, tag, adopt, shape, names) -> the stored integers, a list
-- in the order of `names`; false when the key is missing; nil and the
-- stored tag when the state was written by another limit (tag_same(by,
-- tag, adopt) is false: the caller refuses with tag_refuse); nil alone when
-- the key holds anything else.
--
-- The state is the string "<tag>:<n1>:<n2>..." (lib/tag), each n a
-- canonical integer in [0, 2^53 - 1] (lib/stored); `shape` is the Lua
-- pattern of the part after the tag's colon, one capture per name
-- ('^(%d+):(%d+)$' for two). A hash of exactly the fields `names`, with or
-- without a field "by" holding the tag (the form before states were
-- strings, and before tags), is read the same way; the caller's next write
-- replaces it with the string. A key of another type raises WRONGTYPE
-- before any write.
--
-- Example: "b100000x10:3:1764000000000000" read with tag 'b100000x10',
-- shape '^(%d+):(%d+)$' -> {3, 1764000000000000}; with tag 'b1000x10' ->
-- nil, 'b100000x10' ({3, 1764000000000000} when adopting); "3" -> nil.

--@include lib/stored
--@include lib/tag

local function state_read(key, tag, adopt, shape, names)
  local stored = redis.pcall('GET', key)
  if not stored then return false end
  local by, raw = nil, {}
  if type(stored) == 'table' then
    -- WRONGTYPE: a hash of the older form (any other type raises here).
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      if all[j] == 'by' then by = all[j + 1] end
      for x = 1, #names do
        if all[j] == names[x] then raw[x] = all[j + 1] end
      end
    end
    if #all ~= 2 * #names + (by and 2 or 0) then return nil end
  else
    local at = string.find(stored, ':', 1, true)
    if not at then return nil end
    by = string.sub(stored, 1, at - 1)
    raw = {string.match(stored, shape, at + 1)}
  end
  if by then
    if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then return nil end
    if not tag_same(by, tag, adopt) then return nil, by end
  end
  local out = {}
  for x = 1, #names do
    out[x] = stored_int(raw[x], 0, 9007199254740991)
    if not out[x] then return nil end
  end
  return out
end
