-- rate/token_bucket/check_at_most: take as many tokens as the bucket holds, up to `max`.
--
-- go-redis/redis_rate's AllowAtMost for the token bucket: grant
-- min(max, tokens) now and charge exactly those; the decisions are those of
-- rate/gcra/check_at_most for the same T and burst = capacity.
--
-- KEYS[1]   the bucket: the string "b<T>x<C>:<tokens>:<at>" as
--           rate/token_bucket/check writes it (the tag of the limit that
--           wrote it, lib/tag; tokens: integer in [0, capacity]; at:
--           integer microseconds since the Unix epoch, server clock, up to
--           which refill is credited), or a hash {tokens, at[, by]} of the
--           forms before (read the same way, rewritten by the next grant:
--           lib/bucket). Missing means full. Another limit's tag is refused
--           with NOLOCK_STATE; anything else is an error; either way
--           nothing is written.
-- ARGV[1]   max       integer, 1 <= max <= 2^53 - 1: the most tokens wanted.
-- ARGV[2]   interval  T, integer microseconds >= 1 per token.
-- ARGV[3]   capacity  C, integer >= 1, with C x T <= 2^51.
-- ARGV[4]   optional: "adopt" (lib/tag): a bucket tagged with other numbers
--           is read as it is and retagged with this call's by a grant.
--
-- Decision, with now = TIME in microseconds:
--   add = floor((now - at) / T); tokens = min(C, tokens + add);
--   at = now when full, else at + add x T
--   granted = min(max, tokens)
-- When granted > 0, "b<T>x<C>:<tokens - granted>:<at>" is stored and the key expires
-- when the bucket is full again; when granted = 0 nothing is written.
--
-- Reply: {granted, now, tokens, at}, the raw state as rate/token_bucket/check
-- returns it
--   granted      tokens taken by this call, 0 <= granted <= max
--   now          the server time of the decision, microseconds since the epoch
--   tokens, at   the bucket after refill and charge
-- The client derives remaining (tokens), retry_after when nothing was
-- granted, reset_after and a debt left by settlements (an empty bucket whose
-- refill starts after now), as for a check of 1 token.
--
-- Example: capacity 10, 10 per second (T = 100000), 7 tokens at N, full
-- refill credited up to N: max 20 -> {7, N, 0, N}.

--@include lib/fail
--@include lib/args
--@include lib/time
--@include lib/tag
--@include lib/bucket

local MAX = 9007199254740991
local MAX_FILL = 2251799813685248

local adopt = tag_adopt(3)
if #KEYS ~= 1 or adopt == nil then
  return fail('expected 1 key and 3 arguments (and "adopt"), got ' .. #KEYS .. ' and ' .. #ARGV)
end
local max = arg_int(1, 1, MAX)
if not max then return fail('bad max: ' .. tostring(ARGV[1])) end
local step, cap = arg_int(2, 1, MAX_FILL), arg_int(3, 1, MAX)
if not step or not cap or cap * step > MAX_FILL then
  return fail('bad interval or capacity')
end
local tag = 'b' .. ARGV[2] .. 'x' .. ARGV[3]

local now = now_us()
local k, a = bucket_read(KEYS[1], now, step, cap, tag, adopt)
if not k then
  if a then return tag_refuse(KEYS[1], a, tag) end
  return fail('key ' .. KEYS[1] .. ' does not hold a token bucket')
end

local granted = math.min(max, k)
if granted > 0 then
  k = k - granted
  bucket_write(KEYS[1], tag, k, a, step, cap)
end
return {granted, now, k, a}
