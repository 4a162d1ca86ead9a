#!lua flags=no-writes
-- config/inspect_semaphore: every live holder of a semaphore, by its weight
-- and time left, never by its permit id (a secret: whoever has it can
-- release the permits).
--
-- KEYS[1]  the semaphore written by semaphore/acquire: a sorted set of
--          members "<permit id>:<i>" scored by their expiry (server ms),
--          and its tag "by:m<P>" scored 0 (lib/tag), which is not a holder.
--
-- Reply: {n, weight_1, left_1, ..., weight_n, left_n}
--   n         holders with unexpired permits
--   weight_i  how many permits the i-th holder has
--   left_i    ms until its permits expire (an id's permits share one expiry;
--             the latest counts)
--   Holders are in the order their first permit expires.
--
-- Read-only (flags=no-writes): runs with EVALSHA_RO. Expired members are
-- left out, not removed, and so is the tag (its score 0 is no expiry after
-- now). A member not in nolock's form is a definite error naming the key
-- (semaphore/peek checks the rest of the set and the tag's form).
--
-- Example: "a..:1", "a..:2" expiring in 900 ms and "b..:1" in 250 ms:
--   {2, 1, 250, 2, 900}.

--@include lib/fail
--@include lib/time
--@include lib/permits

local key = KEYS[1]
local kind = redis.call('TYPE', key).ok
if kind == 'none' then return {0} end
if kind ~= 'zset' then
  return fail(key .. ' holds a ' .. kind .. ', not a semaphore')
end
local now = math.floor(now_us() / 1000)
local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
local order, weight, latest = {}, {}, {}
for i = 1, #live, 2 do
  local m = live[i]
  if not permit_member(m) then
    return fail(key .. ' holds a sorted set that is not a semaphore')
  end
  local id = string.sub(m, 1, 32)
  if not weight[id] then
    order[#order + 1] = id
    weight[id] = 0
  end
  weight[id] = weight[id] + 1
  latest[id] = tonumber(live[i + 1])
end
local reply = {#order}
for _, id in ipairs(order) do
  reply[#reply + 1] = weight[id]
  reply[#reply + 1] = latest[id] - now
end
return reply
