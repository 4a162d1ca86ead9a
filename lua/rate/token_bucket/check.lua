-- rate/token_bucket/check: take `cost` tokens from one or more token buckets, all or nothing.
--
-- A bucket holds up to `capacity` tokens and gains one every T microseconds.
-- Its state is the whole tokens in it and the instant up to which refill
-- has been credited; the part of an interval not yet worth a whole token is
-- kept by not moving that instant past it, so no refill time is ever lost
-- or counted twice.
--
-- KEYS[i]     bucket i: the string "b<T>x<C>:<tokens>:<at>" (lib/bucket)
--               b<T>x<C>  the tag of the limit that wrote it (lib/tag), its
--                         two numbers as ARGV sends them
--               tokens    integer, 0 <= tokens <= capacity
--               at        integer microseconds since the Unix epoch (server
--                         clock): refill is credited up to this instant
--             Missing means full. It expires (PXAT) when the bucket is
--             full again, rounded up to the millisecond. A hash {tokens,
--             at, by} or {tokens, at} (the forms before) is read the same
--             way and replaced by the string at its next admitted call.
-- ARGV[1]     cost      integer, 1 <= cost <= every capacity.
-- ARGV[2i]    interval  T of bucket i, integer microseconds >= 1 per token:
--                       period / rate (rounded up by the caller).
-- ARGV[2i+1]  capacity  C of bucket i, integer >= 1, with C x T <= 2^51.
-- ARGV[2n+2]  optional: "adopt" (lib/tag): a bucket tagged with other
--             numbers ("b..." still) is read as it is and retagged with
--             this call's when admitted, instead of refused.
--
-- Decision, with now = TIME in microseconds, for each bucket:
--   add    = floor((now - at) / T)
--   tokens = min(C, tokens + add); at = now when full, else at + add x T
--   fits   = cost <= tokens
-- When every bucket fits, each stores tokens - cost and at with this
-- call's tag; otherwise nothing is written (a denied call consumes nothing, on
-- any bucket, and tags nothing). A bucket tagged by another limit (other
-- numbers, unless adopting; another algorithm, as a sliding window's state)
-- is refused with NOLOCK_STATE, nothing written on any bucket.
--
-- Reply: {admitted, now, then per bucket: tokens, at} -- the raw state,
-- from which the client derives every answer (src/rate/state.rs).
--   admitted  1 when every bucket fitted and was charged; else 0
--   now       the server time of the decision, microseconds since the epoch
--   tokens    bucket i's tokens after refill, less cost when admitted (the
--             remaining units; when denied it fitted alone iff cost <= tokens)
--   at        the instant refill is credited up to: retry_after is
--             ceil((at + (cost - tokens) x T - now) / 1000) ms, reset_after
--             ceil((at + (C - tokens) x T - now) / 1000) ms
--
-- Guarantees: every bucket is read, its tag compared and decided before the
-- first write. The
-- decisions are exactly those of rate/gcra/check for the same T and burst = C
-- (TAT = at + (C - tokens) x T); only the stored form differs.
--
-- Example: capacity 10, 10 per second (T = 100000), on a missing key at now = N:
-- {1, N, 9, N}, state "b100000x10:9:N" (9 remaining,
-- full in 100 ms). The same key checked with capacity 20: NOLOCK_STATE
-- ("... holds state written by b100000x10, not b100000x20 ...").

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

-- The checks of lib/rate, lib/args, lib/bucket and lib/tag, and lib/fail's
-- errors, written in place (see rate/gcra/check): no helper calls, no table
-- but the reply, whose slots 2i + 1 and 2i + 2 keep bucket i's tokens and
-- at.

local n = #KEYS
local adopt = #ARGV == 2 + 2 * n and ARGV[2 + 2 * n] == 'adopt'
if n < 1 or (#ARGV ~= 1 + 2 * n and not adopt) then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': expected 1 + 2 arguments per key, got '
    .. #ARGV .. ' for ' .. n .. ' keys')
end
-- Arguments convert by arithmetic (tonumber parses a string twice): a
-- non-numeric one raises Lua's own error, still before any write, so the
-- refusal stays definite; only its wording is Lua's.
local cost = ARGV[1] + 0
if cost % 1 ~= 0 or cost < 1 or cost > MAX then
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad cost: ' .. tostring(ARGV[1]))
end
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]

local reply, admitted = {0, now, 0, 0}, 1
for i = 1, n do
  local step, cap = ARGV[2 * i] + 0, ARGV[2 * i + 1] + 0
  if step % 1 ~= 0 or cap % 1 ~= 0 or step < 1 or cap < 1
    or cap * step > MAX_FILL then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': bad interval or capacity for key ' .. i)
  end
  if cost > cap then
    return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': cost is above the capacity of key ' .. i)
  end
  -- The state (lib/bucket, lib/state): "<tag>:<tokens>:<at>", canonical
  -- integers in [0, 2^53 - 1]; missing is a full bucket. Its own tag costs
  -- one comparison of the prefix; another tag, or a hash of the form
  -- before, is looked at only then. A value is converted by arithmetic
  -- once its digits are checked (tonumber parses a string twice).
  local k, a = cap, now
  local prefix = 'b' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'
  local stored = redis.pcall('GET', KEYS[i])
  if stored then
    local len, ks, as = #prefix, nil, nil
    if type(stored) == 'table' then
      -- WRONGTYPE: a hash {tokens, at[, by]} (lib/state), read only here.
      local all, by = redis.call('HGETALL', KEYS[i]), nil
      for f = 1, #all, 2 do
        local name = all[f]
        if name == 'by' then by = all[f + 1]
        elseif name == 'tokens' then ks = all[f + 1]
        elseif name == 'at' then as = all[f + 1] end
      end
      if by and by .. ':' ~= prefix and not (adopt and string.byte(by) == 98) then
        return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
          .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
          .. '; nothing was written')
      end
      if #all ~= (by and 6 or 4) or not (ks and as and string.find(ks, '^%d+$')
        and string.find(as, '^%d+$')) then ks = nil end
    elseif string.sub(stored, 1, len) == prefix then
      ks, as = string.match(stored, '^(%d+):(%d+)$', len + 1)
    else
      local at = string.find(stored, ':', 1, true)
      local by = at and string.sub(stored, 1, at - 1)
      if not by or not string.find(by, '^[a-z]%d+x%d+$') and not string.find(by, '^m%d+$') then
        return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
          .. ' does not hold a token bucket')
      end
      -- lib/tag's tag_same and tag_refuse: adopting reads any bucket's
      -- ('b' is byte 98).
      if not adopt or string.byte(by) ~= 98 then
        return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. KEYS[i]
          .. ' holds state written by ' .. by .. ', not ' .. string.sub(prefix, 1, len - 1)
          .. '; nothing was written')
      end
      ks, as = string.match(stored, '^(%d+):(%d+)$', at + 1)
    end
    -- Canonical: at most 16 digits, no leading zero (a number of n digits
    -- is at least 10^(n-1)), at most 2^53 - 1.
    k = ks and #ks <= 16 and ks + 0
    a = ks and #as <= 16 and as + 0
    if not k or not a or k > MAX or a > MAX or (#ks > 1 and k < 10 ^ (#ks - 1))
      or (#as > 1 and a < 10 ^ (#as - 1)) then
      return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': key ' .. KEYS[i]
        .. ' does not hold a token bucket')
    end
    -- Refill up to now, one token per T; a lowered capacity clamps.
    if now > a then
      local add = math.floor((now - a) / step)
      if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
    end
    if k > cap then k = cap end
  end
  if cost > k then admitted = 0 end
  reply[2 * i + 1], reply[2 * i + 2] = k, a
end
reply[1] = admitted

-- Every admitted bucket is written whole with this call's tag (a hash of
-- the older form, or another tag adopted, is replaced), its numbers as
-- text formatted with %d (see rate/gcra/check).
if admitted == 1 then
  for i = 1, n do
    local k, a = reply[2 * i + 1] - cost, reply[2 * i + 2]
    local step, cap = ARGV[2 * i], ARGV[2 * i + 1]
    redis.call('SET', KEYS[i], 'b' .. step .. 'x' .. cap .. string.format(':%d:%d', k, a),
      'PXAT', string.format('%d', math.ceil((a + (cap - k) * step) / 1000)))
    reply[2 * i + 1] = k
  end
end
return reply
