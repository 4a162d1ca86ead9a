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

local function gcra_tat(key, now, tag, adopt)
  local stored = redis.call('GET', key)
  if not stored then return now end
  local at = string.find(stored, ':', 1, true)
  if at then
    local by = string.sub(stored, 1, at - 1)
    if by ~= tag then
      if not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
        return nil, redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. key
          .. ' does not hold a GCRA state')
      end
      -- lib/tag's tag_same and tag_refuse, in place (helpers cost a
      -- closure per call): adopting reads any GCRA state ('g' is byte 103).
      if not adopt or string.byte(by) ~= 103 then
        return nil, redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. key
          .. ' holds state written by ' .. by .. ', not ' .. tag .. '; nothing was written')
      end
    end
    stored = string.sub(stored, at + 1)
  end
  local tat = stored_int(stored, 0, now + 2251799813685248)
  if not tat then
    return nil, redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. key
      .. ' does not hold a GCRA state')
  end
  if tat > now then return tat end
  return now
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
