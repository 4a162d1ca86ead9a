#!lua flags=allow-oom
-- rate/calendar/refund: give back units of one admitted charge (only while the charge's period is still counted), or settle it at its real cost (charging an excess to the current period, even past its limit).
--
-- KEYS[i]     limit i (i = 1..n): a counter as rate/calendar/check writes
--             it ("k<h>x<L>:<count>", expiring at its period's end);
--             KEYS[n + 1] the charge's record, KEYS[n + 1 + i] limit i's
--             reset marker (lib/refund).
-- ARGV        as lib/refund with per = 8: amount, actual, at, cost,
--             settle, cap, then per limit: h, L, b0, b1, b2, b3 (as
--             rate/calendar/check takes them, computed for now), held,
--             reset (the charge's reset_after, ms); then optionally "adopt".
--
-- The tag (lib/tag): a counter of another period or limit is refused with
-- NOLOCK_STATE, nothing written on any key, unless the call adopts.
--
-- Refund (and a settlement below the reservation, which gives back give =
-- held - actual): the charge was counted in the period ending at end =
-- floor(at / 1000) + reset (check answers reset = end - now in ms,
-- exactly). A counter whose period still ends at `end` drops by min(give,
-- count); a counter of any other period (the charge's period ended, the
-- next began) is left alone: units refunded there would be units the new
-- period never charged. The period (expiry) is kept.
--
-- Excess (a settlement above the reservation: actual - held): the current
-- period counts e = min(excess, L + cap - count) more units, never below 0
-- (when no period is stored, the one of b holding the server's time is
-- opened; when none holds it, NOLOCK_PERIOD before any write): past L, a
-- debt that denies every check until the period ends.
--
-- The record keeps what is left of the charge, or that it was settled,
-- until the charge's period ends or its deadline, whichever is later.
--
-- Reply: {status, now, then per limit: credited, charged, excess, count,
-- end}, as rate/fixed_window/refund; end is the period's end also when no
-- period is stored (the one of b holding the server's time; 0 when the
-- server is in none of them, nothing being counted).
--
-- Runs on a full server (allow-oom): giving back must not fail for lack of
-- memory. Every key, the record included, is read and checked before the
-- first write.
--
-- Example: limit 10, 7 counted in the period ending at E; a refund of 3
-- from a charge whose end is E gives {0, now, 3, 0, 0, 4, E}; from a charge
-- of the period before, {0, now, 0, 0, 0, 7, E}.

--@include lib/fail
--@include lib/args
--@include lib/div
--@include lib/time
--@include lib/fixed
--@include lib/refund
--@include lib/tag
--@include lib/calendar

local MAX = 9007199254740991

local micros = now_us()
local now = floor_div(micros, 1000)
local n, give, excess, at, cost, settle, cap, held, status, adopt = refund_begin(now, 8)
if not n then return fail(give) end
local charged_in = floor_div(at, 1000)

local tags, limit, count, ends, take, opens, answer_end, until_ms = {}, {}, {}, {}, {}, {}, {}, now
for i = 1, n do
  local j = 8 * i - 1
  local h, l, b = calendar_args(j)
  local reset = arg_int(j + 7, 0, MAX)
  if not h then return fail('bad period or limit for key ' .. i) end
  local tag = string.format('k%dx%d', h, l)
  local c, e = fixed_read(KEYS[i], now, tag, adopt, true)
  if not c then
    if e then return tag_refuse(KEYS[i], e, tag) end
    return fail('key ' .. KEYS[i] .. ' does not hold a counter')
  end
  if not e or e == -1 then
    -- No current period stored (or one without an end): the period the
    -- server's clock is in, which the answer names and an excess opens
    -- (or gives its end). Needed only then: a refund alone on a missing
    -- key answers no end when the server is outside the periods sent.
    local pe = calendar_end(b, now)
    if not pe and (e == -1 or excess[i] > 0) then return calendar_refuse(KEYS[i], now) end
    if excess[i] > 0 or e == -1 then opens[i] = pe end
    answer_end[i] = pe
  end
  tags[i], limit[i], count[i], ends[i], take[i] = tag, l, c, e, 0
  if e == charged_in + reset then take[i] = math.min(give[i], c) end
  until_ms = math.max(until_ms, charged_in + reset)
end

-- Every write is the tagged count, its period set with it or kept.
local reply = {status, micros}
for i = 1, n do
  local c, e = count[i] - take[i], ends[i]
  local charged = 0
  if excess[i] > 0 then
    charged = math.max(0, math.min(excess[i], limit[i] + cap - c, MAX - c))
  end
  if take[i] > 0 or charged > 0 then
    c = c + charged
    local value = string.format('%s:%d', tags[i], c)
    if opens[i] then
      e = opens[i]
      redis.call('SET', KEYS[i], value, 'PXAT', e)
    else
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    end
  elseif e == -1 then
    -- Left without an end: the next admission gives it one.
    e = nil
  end
  if not e or e == -1 then e = answer_end[i] end
  local j = 5 * i - 2
  reply[j], reply[j + 1], reply[j + 2], reply[j + 3], reply[j + 4] = take[i], charged, excess[i], c, e or 0
end
refund_end(n, held, take, until_ms + 1, settle, status)
return reply
