#!lua flags=allow-oom
-- rate/sliding_window/refund: give `amount` units back to one or more sliding windows.
--
-- KEYS[i]     limit i: a hash {start, count, previous} as written by
--             rate/sliding_window/check.
-- ARGV[1]     amount  integer, 1 <= amount <= 2^53-1: units to give back.
-- ARGV[2i]    window  w of limit i, integer milliseconds >= 1.
-- ARGV[2i+1]  limit   L of limit i, integer >= 1, with L x w <= 2^53-1.
--
-- Each state is rolled to the window holding now, as in check; the amount
-- is then taken off the current window's count first (where recent units
-- were charged) and the rest off the previous window's, never below zero.
-- A state left with nothing is deleted; missing keys stay missing.
--
-- Reply: {remaining_1, ..., remaining_n}: units that fit on each limit
-- afterwards, L - count - ceil(previous x (w - e) / w).
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key is read and checked before the first write.
--
-- Example: limit 10 per 1000 ms, count = 6 at e = 0 with previous = 0:
-- refund 2 leaves count = 4 and gives {6}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/stored
--@include lib/time

local MAX = 9007199254740991

local n = #KEYS
if n < 1 or #ARGV ~= 1 + 2 * n then
  return fail('expected 1 + 2 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local amount = arg_int(1, 1, MAX)
if not amount then return fail('bad amount: ' .. tostring(ARGV[1])) end

local now = floor_div(now_us(), 1000)

local window, limit, start, count, previous = {}, {}, {}, {}, {}
for i = 1, n do
  local w, l = arg_int(2 * i, 1, MAX), arg_int(2 * i + 1, 1, MAX)
  if not w or not l or l * w > MAX then
    return fail('bad window or limit for key ' .. i)
  end
  window[i], limit[i] = w, l
  local state = redis.call('HMGET', KEYS[i], 'start', 'count', 'previous')
  if not (state[1] or state[2] or state[3]) and redis.call('EXISTS', KEYS[i]) == 1 then
    return fail('key ' .. i .. ' does not hold a sliding window')
  end
  if state[1] or state[2] or state[3] then
    local s, sc, sp = stored_int(state[1], 0, MAX), stored_int(state[2], 0, MAX), stored_int(state[3], 0, MAX)
    if not s or not sc or not sp then
      return fail('key ' .. i .. ' does not hold a sliding window')
    end
    local cur, c, p = floor_div(now, w) * w, 0, 0
    if s >= cur then
      cur, c, p = s, sc, sp
    elseif s == cur - w then
      p = sc
    end
    start[i], count[i], previous[i] = cur, c, p
  end
end

-- Numbers are passed to Redis as they are: integers below 2^53 are sent
-- exactly (Redis prints them with %.17g, or as integers since 7.2).
local reply = {}
for i = 1, n do
  local w, l = window[i], limit[i]
  local cur, c, p = start[i], count[i] or 0, previous[i] or 0
  if cur then
    local from_count = math.min(c, amount)
    c = c - from_count
    p = p - math.min(p, amount - from_count)
    if c == 0 and p == 0 then
      redis.call('DEL', KEYS[i])
    else
      redis.call('HSET', KEYS[i], 'start', cur,
        'count', c, 'previous', p)
      redis.call('PEXPIREAT', KEYS[i], cur + 2 * w)
    end
  end
  local e = cur and math.max(0, now - cur) or 0
  c, p = math.min(c, l), math.min(p, l)
  reply[i] = math.max(0, l - c - ceil_div(p * (w - e), w))
end
return reply
