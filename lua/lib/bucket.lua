-- lib/bucket: a token bucket's state, read strictly and refilled up to now.
--
-- The state is the string "b<T>x<C>:<tokens>:<at>" (lib/state): tokens, a
-- canonical integer, whole tokens in the bucket; at, integer microseconds
-- since the Unix epoch by the server clock, the instant up to which refill
-- has been credited. It expires (PXAT) when the bucket is full again.
--
-- bucket_read(key, now, step, cap, tag, adopt) -> tokens, at: the bucket at
-- key refilled up to now with one token per step microseconds and clamped
-- to cap (a lowered capacity); a missing key is a full bucket (cap, now).
-- nil and the stored tag when another limit wrote it (the caller refuses
-- with tag_refuse); nil alone when the key holds anything else. A hash
-- {tokens, at[, by]} (the form before 2026-12-05) is read the same way.
--
-- bucket_write(key, tag, tokens, at, step, cap): stores the state with
-- this call's tag (replacing any older form), expiring when full again.
--
-- Example: "b100000x10:3:<N - 250000>" read at now = N with step 100000,
-- cap 10, tag 'b100000x10' -> 5, N - 50000; with tag 'b1000x10' -> nil,
-- 'b100000x10' (and 5, N - 50000 when adopting).

--@include lib/state
--@include lib/div

local BUCKET_FIELDS = {'tokens', 'at'}

local function bucket_read(key, now, step, cap, tag, adopt)
  local state, by = state_read(key, tag, adopt, '^(%d+):(%d+)$', BUCKET_FIELDS)
  if state == false then return cap, now end
  if not state then return nil, by end
  local k, a = state[1], state[2]
  if now > a then
    local add = floor_div(now - a, step)
    if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
  end
  if k > cap then k = cap end
  return k, a
end

local function bucket_write(key, tag, k, a, step, cap)
  redis.call('SET', key, tag .. string.format(':%d:%d', k, a),
    'PXAT', ceil_div(a + (cap - k) * step, 1000))
end
