-- lib/window: a sliding window's state, read strictly and rolled to now.
--
-- The state is the string "s<w>x<L>:<start>:<count>:<previous>"
-- (lib/state): start, integer ms since the Unix epoch (server clock), the
-- start of the window count belongs to, a multiple of w; count, the units
-- admitted in it; previous, those of the window before. It expires (PXAT)
-- at start + 2w, when neither count matters any more.
--
-- window_read(key, now, w, tag, adopt) -> start, count, previous: the state
-- at key rolled to the window holding now: a state one window old becomes
-- previous, an older one counts as empty, one the clock has stepped back
-- from is kept as is. A missing key is an empty window at floor(now / w) x
-- w. nil and the stored tag when another limit wrote it (the caller
-- refuses with tag_refuse); nil alone when the key holds anything else. A
-- hash {start, count, previous[, by]} (the form before 2026-12-05) is read
-- the same way.
--
-- window_write(key, tag, start, count, previous, w): stores the state with
-- this call's tag (replacing any older form), expiring at start + 2w.
--
-- Example: "s1000x10:1000:4:0" read at now = 2300 with w 1000, tag
-- 's1000x10' -> 2000, 0, 4; with tag 's1000x5' -> nil, 's1000x10' (and
-- 2000, 0, 4 when adopting).

--@include lib/state
--@include lib/div

local WINDOW_FIELDS = {'start', 'count', 'previous'}

local function window_read(key, now, w, tag, adopt)
  local cur = floor_div(now, w) * w
  local state, by = state_read(key, tag, adopt, '^(%d+):(%d+):(%d+)$', WINDOW_FIELDS)
  if state == false then return cur, 0, 0 end
  if not state then return nil, by end
  local s, c, p = state[1], state[2], state[3]
  if s >= cur then return s, c, p end -- this window, or the clock stepped back
  if s == cur - w then return cur, 0, c end
  return cur, 0, 0
end

local function window_write(key, tag, start, count, previous, w)
  redis.call('SET', key, tag .. string.format(':%d:%d:%d', start, count, previous),
    'PXAT', start + 2 * w)
end
