-- lib/refund: what every rate refund starts and ends with: its arguments,
-- and the charge's record, which caps all refunds of one charge at its cost
-- whatever copies of the charge the clients hold.
--
-- KEYS[1..n]   the limits, as the algorithm's check writes them.
-- KEYS[n + 1]  the charge's record: keys::derive(first key, "charge#<id>"),
--              in the limits' slot. A string "h_1,...,h_n": the units of the
--              charge still held on each limit (canonical integers), written
--              by the first refund that gives anything back and kept until
--              the charge can give nothing back on any limit. Missing: no
--              refund of this charge gave anything back yet.
-- ARGV[1]      amount  integer >= 1: units to give back.
-- ARGV[2]      at      integer microseconds: the server time of the charge.
-- ARGV[3]      cost    integer >= 1: what the charge took (every copy of a
--                      charge carries the same cost).
-- ARGV[4i .. 4i+3]     limit i: two numbers of its quota (as its check takes
--                      them), held (the client's count of units still held,
--                      <= cost) and reset (the charge's reset_after on limit i, ms).
--
-- refund_begin() -> n, amount, at, cost, held: held[i] is the least of the
-- client's count, the cost and the record's h_i; or nil and the message to
-- fail with (before any write). A record that is not exactly n canonical
-- integers <= cost is foreign data: a definite error, nothing written.
--
-- refund_end(n, held, credited, until_ms): when anything was credited,
-- stores h_i = held[i] - credited[i] with PXAT until_ms, the instant after
-- which no copy of the charge could credit anything on any limit (each
-- algorithm's own rule says when), so the record costs memory only while
-- it matters. A resend or a copy then finds the record and gives back at
-- most what is left.

--@include lib/args

local function refund_begin()
  local n = #KEYS - 1
  if n < 1 or #ARGV ~= 3 + 4 * n then
    return nil, 'expected 3 + 4 arguments per limit and a record key, got ' .. #ARGV
      .. ' arguments for ' .. #KEYS .. ' keys'
  end
  local MAX = 9007199254740991
  local amount, at, cost = arg_int(1, 1, MAX), arg_int(2, 0, MAX), arg_int(3, 1, MAX)
  if not amount or not at or not cost then return nil, 'bad amount, charge time or cost' end
  local held = {}
  for i = 1, n do
    local h = arg_int(4 * i + 2, 0, cost)
    if not h or not arg_int(4 * i + 3, 0, MAX) then
      return nil, 'bad held or reset for limit ' .. i
    end
    held[i] = h
  end
  local record = redis.call('GET', KEYS[n + 1])
  if record then
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
      return nil, 'key ' .. KEYS[n + 1] .. ' does not hold a refund record of this charge'
    end
  end
  return n, amount, at, cost, held
end

local function refund_end(n, held, credited, until_ms)
  local any, left = false, {}
  for i = 1, n do
    if credited[i] > 0 then any = true end
    left[i] = math.max(0, held[i] - credited[i])
  end
  if any then
    redis.call('SET', KEYS[n + 1], table.concat(left, ','), 'PXAT', until_ms)
  end
end
