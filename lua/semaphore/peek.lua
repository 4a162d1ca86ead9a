#!lua flags=no-writes
-- semaphore/peek: read a semaphore without changing it.
--
-- KEYS[1]  the semaphore written by semaphore/acquire.
--
-- Reply: {in_use, holders, next_expiry}
--   in_use       unexpired permits (members with expiry after now)
--   holders      distinct ids among them (weighted holders count once)
--   next_expiry  ms until the earliest unexpired permit expires; -1 if none
--
-- Read-only (flags=no-writes): runs with EVALSHA_RO, replicas accept it;
-- expired members are counted out, not removed. Every unexpired member and
-- score is checked (this is O(permits held)), and the lowest and highest
-- members: anything not in nolock's form is a definite error.
--
-- Example: 3 unexpired members "a:1", "a:2", "b:1", earliest in 250 ms:
--   {3, 2, 250}.

--@include lib/fail
--@include lib/stored
--@include lib/time
--@include lib/permits

local key = KEYS[1]
local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0, 0, -1} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local function member_and_score_ok(m, score)
  return permit_member(m) and stored_int(score, 1, 9007199254740991) ~= nil
end
for _, rank in ipairs({0, -1}) do
  local pair = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  if not member_and_score_ok(pair[1], pair[2]) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
end
local now = math.floor(now_us() / 1000)
local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
local holders = 0
for i = 1, #live, 2 do
  if not member_and_score_ok(live[i], live[i + 1]) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
  if live[i]:sub(-2) == ':1' then holders = holders + 1 end
end
local next_expiry = -1
if live[2] then next_expiry = tonumber(live[2]) - now end
return {#live / 2, holders, next_expiry}
