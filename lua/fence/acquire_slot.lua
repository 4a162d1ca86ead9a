-- fence/acquire_slot: take a lock if it is free, with the next fence of its cluster slot's shared counter.
--
-- KEYS[1]  the lock: a string "<fence>:<token>" with a TTL, as fence/acquire
--          writes it (extend, release and the fenced writes read it alike).
-- KEYS[2]  the slot's fence counter: an integer string with NO TTL, shared by
--          every resource whose lock is in this slot, set to each grant's
--          fence and never lowered. nolock names it "{<tag>}!nolock:fences",
--          <tag> a short text that hashes to the lock's slot.
-- KEYS[3]  the resource's own fence counter of fence/acquire ("{r}:fence"):
--          only read, never written. Absent in bounded mode, unless the
--          resource was locked before the switch or raised by fence/advance.
-- KEYS[4]  optional: the waiting flag, as KEYS[3] of fence/acquire.
-- ARGV[1]  token  non-empty string, unique per acquisition.
-- ARGV[2]  ttl    integer milliseconds, 1 <= ttl <= 2^53-1.
-- ARGV[3]  wait   with KEYS[4] only: integer milliseconds, 1 <= wait <=
--                 2^53-1, as ARGV[3] of fence/acquire.
--
-- Reply: {acquired, detail}, as fence/acquire's:
--   acquired = 1: detail is the fence of this grant, a decimal STRING:
--                 max(slot counter, resource counter) + 1.
--   acquired = 0: held under another token; detail is its PTTL in ms (-1
--                 without an expiry). Nothing was written but the waiting flag.
--
-- Guarantees: the check, the draw and the SET happen in one atomic step. The
-- slot counter only grows and every grant of a resource in this slot draws
-- from it, so each resource's fences strictly increase and never repeat,
-- even after its lock expired and it was locked again; the resource counter
-- in the max keeps a resource's fences above those it got before the switch
-- (or above a floor fence/advance set). State per resource lives only as
-- long as its lock; the counters number at most 16384.
-- A re-entry (the lock already holds ARGV[1]) sets the TTL again and answers
-- the stored fence, drawing nothing. A lock value not of the form
-- "<digits>:<token>" is a lock held by someone else.
-- Everything is checked before the first write: a counter that is not a
-- canonical decimal in [1, 2^63-2] (at 2^63-1 it cannot grow) is an error
-- naming the key, with nothing written.
--
-- Example: slot counter 41, no resource counter, free lock, token "ab..":
--   {1, "42"}, the lock holds "42:ab..", the slot counter is "42". Another
--   resource of the slot next: {1, "43"}. A resource whose own counter is
--   1000: {1, "1001"}, and the slot counter is "1001".

--@include lib/fail
--@include lib/decimal

local token = ARGV[1]
if token == nil or token == '' then
  return fail('empty token')
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl % 1 ~= 0 or ttl < 1 or ttl > 9007199254740991 then
  return fail('bad ttl: ' .. tostring(ARGV[2]))
end
local wait
if KEYS[4] then
  wait = tonumber(ARGV[3])
  if not wait or wait % 1 ~= 0 or wait < 1 or wait > 9007199254740991 then
    return fail('bad wait: ' .. tostring(ARGV[3]))
  end
end

-- Both counters are checked whether or not the lock is free, so a foreign
-- value in the shared counter is found at once, not at the next free lock.
local top = '0'
for i = 2, 3 do
  local counter = redis.call('GET', KEYS[i])
  if counter then
    if not dec_canonical(counter, '9223372036854775806') then
      return fail(KEYS[i] .. ': fence counter holds a non-counter value (or is at its limit)')
    end
    if dec_less(top, counter) then
      top = counter
    end
  end
end

local holder = redis.call('GET', KEYS[1])
if not holder then
  -- top + 1, as digits: carry the trailing nines (top < 2^63-1, not all nines
  -- once a '0' is put in front).
  local head, nines = string.match('0' .. top, '^(.-)(9*)$')
  local fence = string.sub(head, 1, -2) .. string.char(string.byte(head, -1) + 1)
    .. string.rep('0', #nines)
  fence = string.match(fence, '^0*(.*)$')
  redis.call('SET', KEYS[1], fence .. ':' .. token, 'PX', ttl)
  redis.call('SET', KEYS[2], fence)
  return {1, fence}
end

local held, owner = string.match(holder, '^(%d+):(.*)$')
if owner == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, held}
end
if wait and redis.call('PTTL', KEYS[4]) < wait then
  redis.call('SET', KEYS[4], '1', 'PX', wait)
end
return {0, redis.call('PTTL', KEYS[1])}
