-- lib/bucket: a token bucket's state, read strictly and refilled up to now.
--
-- bucket_read(key, now, step, cap) -> tokens, at: the bucket at key, a hash
-- of exactly {tokens, at} (canonical integers), refilled up to now with one
-- token per step microseconds and clamped to cap (a lowered capacity); a
-- missing key is a full bucket (cap, now). nil when the key holds anything
-- else; a key of another type raises WRONGTYPE before any write.

--@include lib/stored
--@include lib/div

local function bucket_read(key, now, step, cap)
  local all = redis.call('HGETALL', key)
  if #all == 0 then return cap, now end
  if #all ~= 4 then return nil end
  local k, a
  for j = 1, 3, 2 do
    local v = stored_int(all[j + 1], 0, 9007199254740991)
    if all[j] == 'tokens' then k = v elseif all[j] == 'at' then a = v end
  end
  if not k or not a then return nil end
  if now > a then
    local add = floor_div(now - a, step)
    if k + add >= cap then k, a = cap, now else k, a = k + add, a + add * step end
  end
  if k > cap then k = cap end
  return k, a
end
