-- lib/window: a sliding window's state, read strictly and rolled to now.
--
-- window_read(key, now, w, tag, adopt) -> start, count, previous: the state
-- at key, a hash of exactly {start, count, previous, by} (canonical
-- integers, start in ms since the epoch; by the tag of the limit that wrote
-- it: lib/tag), or of exactly {start, count, previous} (written before
-- tags), rolled to the window holding now: a state one window old becomes
-- previous, an older one counts as empty, one the clock has stepped back
-- from is kept as is. A missing key is an empty window at floor(now / w) x
-- w. nil and the stored tag when `by` names another limit than `tag`
-- (tag_same(by, tag, adopt) is false: the caller refuses with tag_refuse);
-- nil alone when the key holds anything else. A key of another type raises
-- WRONGTYPE before any write.
--
-- Example: {start = 1000, count = 4, previous = 0, by = 's1000x10'} read at
-- now = 2300 with w 1000, tag 's1000x10' -> 2000, 0, 4; with tag 's1000x5'
-- -> nil, 's1000x10' (and 2000, 0, 4 when adopting).

--@include lib/stored
--@include lib/div
--@include lib/tag

local function window_read(key, now, w, tag, adopt)
  local cur = floor_div(now, w) * w
  local all = redis.call('HGETALL', key)
  if #all == 0 then return cur, 0, 0 end
  local s, c, p, by
  for j = 1, #all, 2 do
    local f = all[j]
    if f == 'by' then
      by = all[j + 1]
    elseif f == 'start' or f == 'count' or f == 'previous' then
      local v = stored_int(all[j + 1], 0, 9007199254740991)
      if f == 'start' then s = v elseif f == 'count' then c = v else p = v end
    end
  end
  if by and not tag_same(by, tag, adopt) then return nil, by end
  if not (s and c and p) or #all ~= (by and 8 or 6) then return nil end
  if s >= cur then return s, c, p end -- this window, or the clock stepped back
  if s == cur - w then return cur, 0, c end
  return cur, 0, 0
end
