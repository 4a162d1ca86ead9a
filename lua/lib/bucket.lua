-- lib/bucket: a token bucket's state, read strictly and refilled up to now.
--
-- bucket_read(key, now, step, cap, tag, adopt) -> tokens, at: the bucket at
-- key, a hash of exactly {tokens, at, by} (tokens and at canonical integers,
-- by the tag of the limit that wrote it: lib/tag), or of exactly {tokens,
-- at} (written before tags), refilled up to now with one token per step
-- microseconds and clamped to cap (a lowered capacity); a missing key is a
-- full bucket (cap, now). nil and the stored tag when `by` names another
-- limit than `tag` (tag_same(by, tag, adopt) is false: the caller refuses
-- with tag_refuse); nil alone when the key holds anything else. A key of
-- another type raises WRONGTYPE before any write.
--
-- Example: {tokens = 3, at = N - 250000, by = 'b100000x10'} read at now = N
-- with step 100000, cap 10, tag 'b100000x10' -> 5, N - 50000; with tag
-- 'b1000x10' -> nil, 'b100000x10' (and 5, N - 50000 when adopting).

--@include lib/stored
--@include lib/div
--@include lib/tag

local function bucket_read(key, now, step, cap, tag, adopt)
  local all = redis.call('HGETALL', key)
  if #all == 0 then return cap, now end
  local k, a, by
  for j = 1, #all, 2 do
    local f = all[j]
    if f == 'by' then
      by = all[j + 1]
    elseif f == 'tokens' then
      k = stored_int(all[j + 1], 0, 9007199254740991)
    elseif f == 'at' then
      a = stored_int(all[j + 1], 0, 9007199254740991)
    end
  end
  if by and not tag_same(by, tag, adopt) then return nil, by end
  if not k or not a or #all ~= (by and 6 or 4) then return nil end
  if now > a then
    local add = floor_div(now - a, step)
    if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
  end
  if k > cap then k = cap end
  return k, a
end
