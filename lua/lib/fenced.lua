-- lib/fenced: a fenced value's arguments, and its own check and write.
--
-- The value lives in a hash {value, fence}: the bytes and the fence of the
-- grant that last wrote them (fence/write, fence/write_held).
--
-- fenced_args() -> the writer's fence, ARGV[1], when it is a canonical
-- decimal in [1, 2^64-1] and the value, ARGV[2], is present; otherwise nil
-- and the refusal to return (lib/fail).
-- fenced_store(key, fence, value) -> {1, fence} after storing value with
-- fence in the hash at key; {0, stored} when the hash already holds a
-- greater fence (a newer grant wrote), nothing written. A hash without a
-- canonical fence field is refused (lib/fail) and a key of another type
-- raises WRONGTYPE, both before any write. An EQUAL stored fence is
-- accepted: one grant may write several times.
--
-- Example: {value "a", fence "7"} at key: fenced_store(key, '9', 'b') ->
-- {1, '9'}, the hash is {value "b", fence "9"}; fenced_store(key, '8',
-- 'c') -> {0, '9'}.

--@include lib/fail
--@include lib/decimal

local function fenced_args()
  local fence = ARGV[1]
  if not dec_canonical(fence, U64_MAX) then
    return nil, fail('bad fence: ' .. tostring(fence))
  end
  if ARGV[2] == nil then
    return nil, fail('missing value')
  end
  return fence
end

local function fenced_store(key, fence, value)
  local stored = redis.call('HGET', key, 'fence')
  if stored then
    if not dec_canonical(stored, U64_MAX) then
      return fail(key .. ' holds a non-fence value')
    end
    if dec_less(fence, stored) then
      return {0, stored}
    end
  elseif redis.call('EXISTS', key) == 1 then
    return fail(key .. ' has no fence field')
  end
  redis.call('HSET', key, 'value', value, 'fence', fence)
  return {1, fence}
end
