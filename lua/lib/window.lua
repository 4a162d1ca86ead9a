-- lib/window: a sliding window's state, read strictly and rolled to now.
--
-- window_read(key, now, w) -> start, count, previous: the state at key, a
-- hash of exactly {start, count, previous} (canonical integers; start in ms
-- since the epoch), rolled to the window holding now: a state one window old
-- becomes previous, an older one counts as empty, one the clock has stepped
-- back from is kept as is. A missing key is an empty window at
-- floor(now / w) x w. nil when the key holds anything else; a key of another
-- type raises WRONGTYPE before any write.

--@include lib/stored
--@include lib/div

local function window_read(key, now, w)
  local cur = floor_div(now, w) * w
  local all = redis.call('HGETALL', key)
  if #all == 0 then return cur, 0, 0 end
  if #all ~= 6 then return nil end
  local s, c, p
  for j = 1, 5, 2 do
    local v = stored_int(all[j + 1], 0, 9007199254740991)
    local f = all[j]
    if f == 'start' then s = v elseif f == 'count' then c = v elseif f == 'previous' then p = v end
  end
  if not (s and c and p) then return nil end
  if s >= cur then return s, c, p end -- this window, or the clock stepped back
  if s == cur - w then return cur, 0, c end
  return cur, 0, 0
end
