-- lib/gcra: a GCRA limit: its arguments and its state, read strictly.
--
-- Shared by peek, check_at_most and refund (check writes them in place).
--
-- gcra_tat(key, now, tag, adopt) -> max(TAT, now): the theoretical arrival
-- time stored at key (integer microseconds since the epoch, server clock),
-- or now when the key is missing or its TAT has passed. The state is
-- "<tag>:<TAT>" (lib/tag), or a bare TAT written before tags; its tag must
-- be `tag` (any GCRA tag when adopting). Else nil and the reply to return:
-- NOLOCK_STATE for another limit's tag, a definite error for anything
-- nolock could not have written (the TAT a canonical integer no later than
-- now + 2^51). A key of another type raises WRONGTYPE before any write.

--@include lib/args
--@include lib/stored
--@include lib/fail
--@include lib/tag

local function gcra_tat(key, now, tag, adopt)
  local stored = redis.call('GET', key)
  if not stored then return now end
  local at = string.find(stored, ':', 1, true)
  if at then
    local by = string.sub(stored, 1, at - 1)
    if by ~= tag then
      if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
        return nil, fail('key ' .. key .. ' does not hold a GCRA state')
      end
      if not tag_same(by, tag, adopt) then return nil, tag_refuse(key, by, tag) end
    end
    stored = string.sub(stored, at + 1)
  end
  local tat = stored_int(stored, 0, now + 2251799813685248)
  if not tat then return nil, fail('key ' .. key .. ' does not hold a GCRA state') end
  if tat > now then return tat end
  return now
end

-- gcra_tag(i) -> limit i's tag: "g<T>x<b>" from ARGV[2i] and ARGV[2i + 1]
-- (checked by gcra_limit first).
local function gcra_tag(i)
  return 'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1]
end

-- gcra_state(tag, tat) -> the string a GCRA state is stored as. string.format
-- and not `..`: Lua prints a number with 14 digits, and a TAT has 16.
local function gcra_state(tag, tat)
  return tag .. ':' .. string.format('%d', tat)
end

-- gcra_limit(i, cost) -> T, b: limit i's emission interval (ARGV[2i],
-- microseconds) and burst (ARGV[2i+1]), or nil unless 1 <= T, 1 <= b,
-- b x T <= 2^51 and cost <= b.
local function gcra_limit(i, cost)
  local step, b = arg_int(2 * i, 1, 2251799813685248), arg_int(2 * i + 1, 1, 9007199254740991)
  if not step or not b or b * step > 2251799813685248 or cost > b then return nil end
  return step, b
end

-- gcra_answer(t, now, cost, T, b, fits) -> fits (1/0), remaining,
-- retry_after, reset_after for a limit whose TAT is t (after any charge):
--   remaining    floor((b x T - (t - now)) / T), never below 0
--   retry_after  ms (rounded up) until cost fits; -1 when it fits
--   reset_after  ms (rounded up) until the limit is full
-- Every dividend is below 2^53 (t - now <= 2^52), so the divisions are
-- exact (see lib/div).
