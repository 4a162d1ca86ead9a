-- lib/refund: what every rate refund and settlement starts and ends with:
-- its arguments, the limits' reset markers, and the charge's record, which
-- caps all refunds of one charge at its cost and lets it be settled once,
-- whatever copies of the charge the clients hold.
--
-- KEYS[1..n]   the limits, as the algorithm's check writes them.
-- KEYS[n + 1]  the charge's record: keys::derive(first key, "charge#<id>"),
--              in the limits' slot. Either "h_1,...,h_n", the units of the
--              charge still held on each limit (canonical integers), written
--              by the first refund that gives anything back, or "s": the
--              charge was settled (nothing of it can be given back or
--              settled again). Kept until the charge's deadline, or until
--              it has drained if that is later: as long as any copy of the
--              charge could act on it. Missing: no refund gave anything
--              back yet, and it was not settled.
-- KEYS[n + 1 + i]  limit i's reset marker: keys::derive(limit key,
--              "reset"), written by rate/reset: the server time (integer
--              microseconds) of the limit's latest reset. Missing: no reset
--              within the limit's drain horizon.
-- ARGV[1]      amount  integer >= 0: for a refund, the units to give back
--                      (>= 1); 0 for a settlement.
-- ARGV[2]      actual  integer >= 0: for a settlement, the charge's real
--                      cost (0 for a refund).
-- ARGV[3]      at      integer microseconds: the server time of the charge.
-- ARGV[4]      cost    integer >= 1: what the charge took (every copy of a
--                      charge carries the same cost).
-- ARGV[5]      settle  the charge's deadline, integer milliseconds since the
--                      epoch (>= 1): after it the charge counts as settled at
--                      its cost, and neither a refund nor a settlement acts.
-- ARGV[6]      cap     integer >= 0: how many units a settlement may push a
--                      limit beyond empty (2^53 - 1: no cap).
-- ARGV[4i+3 .. 4i+6]   limit i: two numbers of its quota (as its check takes
--                      them), held (the client's count of units still held,
--                      <= cost) and reset (the charge's reset_after on limit
--                      i, ms). A calendar limit (rate/calendar/refund) has
--                      per = 8 numbers: its check's six, then held and
--                      reset; in general limit i's are ARGV[per(i-1)+7 ..
--                      per i + 6], held and reset the last two.
--
-- ARGV[7 + per n]  optional: "adopt" (lib/tag), from a handle following a
--              declared change of its stored numbers.
--
-- refund_begin(now_ms, per) -> n, give, excess, at, cost, settle, cap,
-- held, status, adopt: held[i] is the least of the client's count, the cost and
-- the record's h_i. Per limit, give[i] is what to give back (a refund:
-- min(amount, held[i]); a settlement: held[i] - actual when positive) and
-- excess[i] what to charge beyond the charge (a settlement: actual -
-- held[i] when positive, even past the limit: into debt). status 0 when the
-- call may act, 1 when the charge was settled already, 2 when the charge's
-- power has ended: its deadline has passed, or a limit was reset at or
-- after the charge (a reset forgives everything before it, so a refund of
-- an earlier charge would give back units that later checks took); when it
-- is not 0, give and excess are all 0: the call changes nothing. Or nil and
-- the message to fail with (before any write). A record that is neither
-- "s" nor exactly n canonical integers <= cost, or a marker that is not a
-- canonical integer, is foreign data: a definite error, nothing written.
--
-- refund_end(n, held, credited, until_ms, settle, status): a call that
-- acted stores its record until the later of until_ms (the instant after
-- which no copy of the charge could credit anything on any limit: each
-- algorithm's own rule says when) and the deadline: a settlement "s", a
-- refund that gave anything back h_i = held[i] - credited[i]. So a later
-- settlement of a copy still sees the refund, and the record costs memory
-- only while it matters.

--@include lib/args
--@include lib/stored

local function refund_begin(now_ms, per)
  per = per or 4
  local n = (#KEYS - 1) / 2
  local adopt = n >= 1 and #ARGV == 7 + per * n and ARGV[#ARGV] == 'adopt'
  if n < 1 or n % 1 ~= 0 or (#ARGV ~= 6 + per * n and not adopt) then
    return nil, 'expected 6 + ' .. per .. ' arguments per limit, a record key and a reset key per limit, got '
      .. #ARGV .. ' arguments for ' .. #KEYS .. ' keys'
  end
  local MAX = 9007199254740991
  local amount, actual = arg_int(1, 0, MAX), arg_int(2, 0, MAX)
  local at, cost, settle = arg_int(3, 0, MAX), arg_int(4, 1, MAX), arg_int(5, 1, MAX)
  local cap = arg_int(6, 0, MAX)
  if not amount or not actual or not at or not cost or not settle or not cap then
    return nil, 'bad amount, excess, charge time, cost, deadline or cap'
  end
  local held = {}
  for i = 1, n do
    local h = arg_int(per * i + 5, 0, cost)
    if not h or not arg_int(per * i + 6, 0, MAX) then
      return nil, 'bad held or reset for limit ' .. i
    end
    held[i] = h
  end
  local status = 0
  local record = redis.call('GET', KEYS[n + 1])
  if record == 's' then
    status = 1
  elseif record then
    -- n canonical integers <= cost, separated by commas, as refund_end writes them.
    local i, pos, ok = 0, 1, #record <= 17 * n
    while ok do
      local stop = string.find(record, ',', pos, true)
      local h = string.sub(record, pos, (stop or 0) - 1)
      i = i + 1
      local v = i <= n and #h <= 16 and (h == '0' or string.find(h, '^[1-9]%d*$')) and tonumber(h)
      if not v or v > cost then ok = false; break end
      if v < held[i] then held[i] = v end
      if not stop then break end
      pos = stop + 1
    end
    if not ok or i ~= n then
      -- Named by its limit's key: the record's own key holds the charge id.
      return nil, 'the refund record of this charge beside key ' .. KEYS[1]
        .. ' holds data nolock did not write'
    end
  end
  for i = 1, n do
    local mark = redis.call('GET', KEYS[n + 1 + i])
    if mark then
      local reset_us = stored_int(mark, 0, MAX)
      if not reset_us then
        return nil, 'key ' .. KEYS[n + 1 + i] .. ' does not hold a reset time'
      end
      if status == 0 and reset_us >= at then status = 2 end
    end
  end
  if status == 0 and now_ms > settle then status = 2 end
  local give, excess = {}, {}
  for i = 1, n do
    if status ~= 0 then
      give[i], excess[i] = 0, 0
    elseif amount == 0 then
      give[i], excess[i] = math.max(0, held[i] - actual), math.max(0, actual - held[i])
    else
      give[i], excess[i] = math.min(amount, held[i]), 0
    end
  end
  return n, give, excess, at, cost, settle, cap, held, status, adopt
end

local function refund_end(n, held, credited, until_ms, settle, status)
  if status ~= 0 then return end
  local keep = math.max(until_ms, settle + 1)
  if tonumber(ARGV[1]) == 0 then
    redis.call('SET', KEYS[n + 1], 's', 'PXAT', keep)
    return
  end
  local any, left = false, {}
  for i = 1, n do
    if credited[i] > 0 then any = true end
    left[i] = math.max(0, held[i] - credited[i])
  end
  if any then
    redis.call('SET', KEYS[n + 1], table.concat(left, ','), 'PXAT', keep)
  end
end
