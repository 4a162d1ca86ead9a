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

--@include lib/fail

local MAX = 9007199254740991

-- The checks of lib/args, lib/stored and lib/tag, written in place: a
-- helper costs a closure and a call on every increment, on the hottest
-- script there is.
local limit, window, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not limit or limit % 1 ~= 0 or limit < 1 or limit > MAX then
  return fail('bad limit: ' .. tostring(ARGV[1]))
end
if not window or window % 1 ~= 0 or window < 1 or window > MAX then
  return fail('bad window: ' .. tostring(ARGV[2]))
end
if not n or n % 1 ~= 0 or n < 1 or n > MAX then return fail('bad n: ' .. tostring(ARGV[3])) end
if n > limit then return fail('n is above limit') end
local adopt = #ARGV == 4 and ARGV[4] == 'adopt'
if #ARGV ~= 3 and not adopt then
  return fail('expected 3 arguments, or 4 with "adopt", got ' .. #ARGV)
end
-- Formatted, not ARGV as sent: equal numbers give one tag ("1e3" is 1000).
local tag = string.format('c%dx%d', limit, window)

local stored = redis.call('GET', KEYS[1])
if not stored then
  -- A new window: one write creates the counter with its expiry.
  redis.call('SET', KEYS[1], string.format('%s:%d', tag, n), 'PX', window)
  return {1, n, window}
end
-- "<tag>:<count>" is at most 34 + 1 + 16 bytes; a bare count is legacy.
local raw = #stored <= 51 and stored
local colon = raw and string.find(raw, ':', 1, true)
if colon then
  local by = string.sub(raw, 1, colon - 1)
  if by ~= tag then
    if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
      return fail('key ' .. KEYS[1] .. ' holds a non-counter value')
    end
    -- lib/tag's tag_same and tag_refuse.
    if not (adopt and string.byte(by, 1) == string.byte(tag, 1)) then
      return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[1]
        .. ' holds state written by ' .. by .. ', not ' .. tag .. '; nothing was written')
    end
  end
  raw = string.sub(raw, colon + 1)
end
-- Only a canonical integer in [0, 2^53 - 1], as this script writes it.
local count = raw and #raw <= 16 and (raw == '0' or string.find(raw, '^[1-9]%d*$')) and tonumber(raw)
if not count or count > MAX then
  return fail('key ' .. KEYS[1] .. ' holds a non-counter value')
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
if pttl == -1 then
  redis.call('SET', KEYS[1], string.format('%s:%d', tag, count), 'PX', window)
  pttl = window
else
  redis.call('SET', KEYS[1], string.format('%s:%d', tag, count), 'KEEPTTL')
end
return {1, count, pttl}
