#!lua flags=allow-oom
-- rate/fixed_window/refund: give back units of one admitted charge (only while the charge's window is still counted), or settle it at its real cost (charging an excess to the current window, even past its limit).
--
-- KEYS[i]     limit i (i = 1..n): a counter as written by
--             rate/fixed_window/check ("f<w>x<L>:<count>", or a bare count
--             written before tags), whose expiry is its window's end;
--             KEYS[n + 1] the charge's record, KEYS[n + 1 + i] limit i's
--             reset marker (lib/refund).
-- ARGV        as lib/refund: amount, actual, at, cost, settle, cap, then per
--             limit: window w (ms >= 1), limit L (>= 1), held, reset (the
--             charge's reset_after, ms); then optionally "adopt".
--
-- The tag (lib/tag): a counter of other numbers is refused with
-- NOLOCK_STATE, nothing written on any key, unless the call adopts;
-- another limit's state is refused even then. Every counter the call
-- changes is written tagged with its w and L (retagged when adopted, tagged
-- when bare); one it leaves alone keeps its tag.
--
-- Refund (and a settlement below the reservation, which gives back give =
-- held - actual): the charge was counted in the window ending at end =
-- floor(at / 1000) + reset (check answers reset = end - now in ms,
-- exactly). A counter whose window still ends at `end` drops by min(give,
-- count); a
-- counter of any other window (the charge's window ended, a new one began)
-- is left alone: units refunded there would be units the new window never
-- charged. The window (expiry) is kept.
--
-- Excess (a settlement above the reservation: actual - held): the current
-- window counts e = min(excess, L + cap - count) more units, never below 0 (a window is
-- opened, [now, now + w), when there is none): past L, a debt that denies
-- every check until the window ends.
--
-- The record keeps what is left of the charge, or that it was settled,
-- until the last of its windows ends or its deadline, whichever is later.
--
-- Reply: {status, now, then per limit: credited, charged, excess, count, end}
--   status    0 applied; 1 settled already; 2 the charge's power had
--             ended (its deadline passed, or a limit was reset since)
--   credited  units taken off counter i
--   charged   e: the excess units counted
--   excess    the units the settlement asked to count (actual - held)
--   count, end  the window afterwards: its count and its end (ms; 0 when
--             there is none) -- the raw state (src/rate/state.rs)
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: limit 10, 7 counted in the window ending at E; a refund of 3
-- from a charge whose end is E gives {0, now, 3, 0, 0, 4, E}; from a charge
-- of the window before, {0, now, 0, 0, 0, 7, E}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/fixed
--@include lib/refund
--@include lib/tag

local MAX = 9007199254740991

local micros = now_us()
local now = floor_div(micros, 1000)
local n, give, excess, at, cost, settle, cap, held, status, adopt = refund_begin(now)
if not n then return fail(give) end
local charged_in = floor_div(at, 1000)

local window, limit, count, ends, take, until_ms = {}, {}, {}, {}, {}, now
for i = 1, n do
  local w, l = arg_int(4 * i + 3, 1, MAX), arg_int(4 * i + 4, 1, MAX)
  local reset = arg_int(4 * i + 6, 0, MAX)
  if not w or not l then return fail('bad window or limit for key ' .. i) end
  local tag = string.format('f%dx%d', w, l)
  local c, e = fixed_read(KEYS[i], now, tag, adopt)
  if not c then
    if e then return tag_refuse(KEYS[i], e, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a counter')
  end
  window[i], limit[i], count[i], ends[i], take[i] = w, l, c, e, 0
  if e == charged_in + reset then take[i] = math.min(give[i], c) end
  until_ms = math.max(until_ms, charged_in + reset)
end

-- Every write is the tagged count (%d: exact below 2^53), its window set
-- with it or kept.
local reply = {status, micros}
for i = 1, n do
  local c, e = count[i] - take[i], ends[i]
  local charged = 0
  if excess[i] > 0 then
    charged = math.max(0, math.min(excess[i], limit[i] + cap - c, MAX - c))
  end
  if take[i] > 0 or charged > 0 then
    local value = string.format('f%dx%d:%d', window[i], limit[i], c + charged)
    if not e then
      c, e = charged, now + window[i]
      redis.call('SET', KEYS[i], value, 'PXAT', e)
    elseif e == -1 then
      c, e = c + charged, now + window[i]
      redis.call('SET', KEYS[i], value, 'PXAT', e)
    else
      c = c + charged
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    end
  end
  if e == -1 then e = now + window[i] end
  local j = 5 * i - 2
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3], reply[j + 4] = take[i], charged, excess[i], c, e or 0
end
refund_end(n, held, take, until_ms + 1, settle, status)
return reply
