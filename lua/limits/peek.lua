#!lua flags=no-writes
-- limits/peek: read a bounded counter without changing it.
--
-- KEYS[1]  the counter written by limits/try_increment: "c<limit>x<window>:<count>",
--          or a bare count written before tags.
-- ARGV     none: any counter is read, whatever its numbers; or limit and
--          window as limits/try_increment takes them (ARGV[1], ARGV[2]),
--          then a counter of other numbers is refused as try_increment
--          refuses it, unless ARGV[3] is "adopt" (lib/tag).
--
-- Reply: {count, pttl}
--   count  the counter (0 when the key does not exist)
--   pttl   milliseconds until the window resets; -2 when there is no counter
--
-- Another limit's state (another tag letter) is refused with NOLOCK_STATE.
--
-- Read-only (flags=no-writes), so it runs with EVALSHA_RO and replicas accept it.
--
-- Example: on "c3x60000:2" with 1200 ms left: {2, 1200}, with no arguments
-- or with 3 and 60000; with 5 and 60000 refused, with 5, 60000 and "adopt"
-- {2, 1200}.

--@include lib/fail
--@include lib/args
--@include lib/stored
--@include lib/tag

local MAX = 9007199254740991

-- Without numbers, any counter's tag is ours by its letter (tag_same
-- adopting compares only that).
local tag, adopt = 'c', true
if #ARGV > 0 then
  adopt = tag_adopt(2)
  if adopt == nil then
    return fail('expected no arguments, 2, or 3 with "adopt", got ' .. #ARGV)
  end
  local limit, window = arg_int(1, 1, MAX), arg_int(2, 1, MAX)
  if not limit or not window then return fail('bad limit or window') end
  tag = string.format('c%dx%d', limit, window)
end

local stored = redis.call('GET', KEYS[1])
local count = 0
if stored then
  local colon = #stored <= 51 and string.find(stored, ':', 1, true)
  if colon then
    local by = string.sub(stored, 1, colon - 1)
    if string.find(by, '^[a-z]%d+x%d+$') or string.find(by, '^m%d+$') then
      if not tag_same(by, tag, adopt) then return tag_refuse(KEYS[1], by, tag) end
      stored = string.sub(stored, colon + 1)
    end
  end
  count = stored_int(stored, 0, MAX)
  if not count then return fail('key ' .. KEYS[1] .. ' holds a non-counter value') end
end
return {count, redis.call('PTTL', KEYS[1])}
