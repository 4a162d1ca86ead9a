-- lib/queue: the waiting line of a fair lock (fence/acquire_fair, fence/release).
--
-- A line is two sorted sets in the resource's slot: the tickets by arrival
-- (score: server microseconds, strictly increasing) and the same tickets by
-- liveness deadline (score: server milliseconds). A ticket whose deadline
-- has come (deadline <= now) is dead.
--
-- queue_head(line, alive, now_ms) -> the first live ticket, or nil. Drops
-- every dead ticket first, and a ticket in the line without a deadline (not
-- written by nolock) when it comes to the head. Both keys must be sorted
-- sets or absent (callers check with TYPE before their first write).
--
-- Example: line {a=10, b=11}, alive {a=500, b=900}, now_ms 600: a is
-- removed from both, the answer is "b".

local function queue_head(line, alive, now_ms)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now_ms)
  for i = 1, #dead, 500 do
    redis.call('ZREM', line, unpack(dead, i, math.min(i + 499, #dead)))
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', alive, '-inf', now_ms)
  end
  while true do
    local head = redis.call('ZRANGE', line, 0, 0)[1]
    if not head or redis.call('ZSCORE', alive, head) then
      return head
    end
    redis.call('ZREM', line, head)
  end
end
