-- limits/try_increment: add n to a bounded counter, only if it stays within limit.
--
-- KEYS[1]  the counter: the string "c<limit>x<window>:<count>" (lib/tag:
--          which counter wrote it, then the count, a canonical integer),
--          whose TTL is the current window.
-- ARGV[1]  limit   integer, 1 <= limit <= 2^53-1: the most the counter may hold.
-- ARGV[2]  window  integer milliseconds, >= 1: set as the key's expiry when the
--                  increment creates the counter, and whenever the counter is
--                  found without a TTL (written by something else), even on a
--                  denial: a full counter without expiry would deny forever.
-- ARGV[3]  n       integer, 1 <= n <= limit: the amount to add, all or nothing.
-- ARGV[4]  optional "adopt": a counter of other numbers is read as it is
--          and retagged with this call's at its write (lib/tag).
--
-- Reply: {admitted, count, pttl}
--   admitted  1 when n was added; 0 when count + n would pass limit (then the
--             count is left as it was: a denial never consumes)
--   count     the counter after the call
--   pttl      milliseconds until the counter expires (the window resets);
--             -2 when there is no counter (nothing was ever admitted)
--
-- The tag: a counter of other numbers (another limit or window) is refused
-- with NOLOCK_STATE, nothing written, unless the call adopts; any other
-- limit's state (another letter) is refused even then. A bare count (written
-- before tags) is read as before and tagged at the next admission. A denial
-- writes no tag.
--
-- Guarantees: the read, the decision and the write happen in one atomic step,
-- so any number of concurrent callers never push the counter past limit. All
-- arguments, the tag and the stored value are checked before the first write.
--
-- Example: limit 3, window 60000, n 1, on a missing key:
--   {1, 1, 60000}  {1, 2, 59998}  {1, 3, 59997}  {0, 3, 59996} ... until expiry;
--   the key holds "c3x60000:3". A call with limit 5 on it is refused.

local MAX = 9007199254740991

-- The checks of lib/args, lib/stored and lib/tag, and lib/fail's errors,
-- written in place: a helper costs a closure and a call on every
-- increment, on the hottest script there is. Arguments convert by
-- arithmetic (tonumber parses a string twice): a non-numeric one raises
-- Lua's own error, still before any write, so the refusal stays definite.
local adopt = #ARGV == 4 and ARGV[4] == 'adopt'
if #ARGV ~= 3 and not adopt then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME
    .. ': expected 3 arguments, or 4 with "adopt", got ' .. #ARGV)
end
local limit, window, n = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
if limit % 1 ~= 0 or limit < 1 or limit > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad limit: ' .. ARGV[1])
end
if window % 1 ~= 0 or window < 1 or window > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad window: ' .. ARGV[2])
end
if n % 1 ~= 0 or n < 1 or n > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad n: ' .. ARGV[3])
end
if n > limit then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': n is above limit')
end
-- The tag and its colon, from the arguments as sent (the Rust side sends
-- canonical integers). Numbers reach Redis as text formatted with %d:
-- Lua's own number-to-string (%.14g) keeps 14 digits and, like the
-- server's conversion of a number argument (%.17g), costs several times
-- what %d does.
local prefix = 'c' .. ARGV[1] .. 'x' .. ARGV[2] .. ':'

local stored = redis.call('GET', KEYS[1])
if not stored then
  -- A new window: one write creates the counter with its expiry.
  redis.call('SET', KEYS[1], prefix .. string.format('%d', n), 'PX', string.format('%d', window))
  return {1, n, window}
end
-- "<tag>:<count>": its own tag costs one comparison of the prefix;
-- another tag, or a bare count (written before tags), is looked at only
-- then.
local len = #prefix
local raw = stored
if string.sub(stored, 1, len) == prefix then
  raw = string.sub(stored, len + 1)
else
  local colon = string.find(stored, ':', 1, true)
  if colon then
    local by = string.sub(stored, 1, colon - 1)
    if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[1]
        .. ' holds a non-counter value')
    end
    -- lib/tag's tag_same and tag_refuse: adopting reads any counter's
    -- ('c' is byte 99).
    if not (adopt and string.byte(by) == 99) then
      return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[1]
        .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
        .. '; nothing was written')
    end
    raw = string.sub(stored, colon + 1)
  end
end
-- Only a canonical integer in [0, 2^53 - 1], as this script writes it;
-- converted by arithmetic once its digits are checked.
local count = #raw <= 16 and (raw == '0' or string.find(raw, '^[1-9]%d*$')) and raw + 0
if not count or count > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[1]
    .. ' holds a non-counter value')
end

-- A counter found without an expiry (written by something else) gets one,
-- even on a denial: a full counter without expiry would deny forever.
local pttl = redis.call('PTTL', KEYS[1])

-- Compared as n > limit - count so that no intermediate passes 2^53.
if n > limit - count then
  if pttl == -1 then
    redis.call('PEXPIRE', KEYS[1], window)
    pttl = window
  end
  return {0, count, pttl}
end
count = count + n
local value = prefix .. string.format('%d', count)
if pttl == -1 then
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', window))
  pttl = window
else
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
end
return {1, count, pttl}
