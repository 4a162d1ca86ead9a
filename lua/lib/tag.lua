-- lib/tag: which limit wrote a state, kept in the state itself.
--
-- Every limit's state carries a tag: its algorithm's letter and the two
-- numbers of its quota exactly as its script takes them, so two limits
-- that would read one state differently never share a tag:
--   g<T>x<b>    rate/gcra           T in us, burst b
--   b<T>x<cap>  rate/token_bucket   one token per T us, capacity cap
--   f<w>x<L>    rate/fixed_window   window w ms, limit L
--   s<w>x<L>    rate/sliding_window window w ms, limit L
--   c<L>x<w>    limits/*            limit L, window w ms
--   m<P>        semaphore/*         P permits
--   k<h>x<L>    rate/calendar       period hash h (< 2^32), limit L
-- A string state is "<tag>:<value>" ("g100000x10:17964...", and
-- "b100000x10:<tokens>:<at>" for a bucket: lib/state); a hash of the
-- older forms has a field "by" holding the tag; a semaphore holds the
-- member "by:<tag>" with score 0 (below every permit's expiry).
--
-- Before its first write a call compares the stored tag with its own. Another
-- tag is refused with NOLOCK_STATE (Error::StateMismatch), naming the key
-- and both tags, nothing written, unless the call adopts: a handle whose
-- stored configuration was changed on purpose (crate::config, a `Keep`
-- change) sends one more argument, "adopt", and then any state of its own
-- algorithm is read as it is and retagged at the call's write. Another
-- algorithm is refused even then. A state without a tag (written before
-- tags existed) is read as before and tagged at its next write.
--
-- tag_adopt(base) -> false when #ARGV == base, true when #ARGV == base + 1
-- and that argument is "adopt", nil otherwise (a bad argument count).
-- tag_refuse(key, stored, ours) -> the NOLOCK_STATE error reply.
-- tag_same(stored, ours, adopt) -> true when a state tagged `stored` may be
-- read by a call tagged `ours`: equal tags, or the same letter when
-- adopting.
--
-- Example: tag_same('g100000x10', 'g100000x10', false) -> true;
-- tag_same('g100000x10', 'g1000x100', false) -> false (refused),
-- with adopt -> true; tag_same('f1000x5', 'g1000x100', true) -> false.

local function tag_adopt(base)
  local n = #ARGV
  if n == base then return false end
  if n == base + 1 and ARGV[n] == 'adopt' then return true end
  return nil
end

local function tag_refuse(key, stored, ours)
  return redis.error_reply('NOLOCK_STATE nolock ' .. SCRIPT_NAME .. ': ' .. key
    .. ' holds state written by ' .. stored .. ', not ' .. ours .. '; nothing was written')
end

local function tag_same(stored, ours, adopt)
  if stored == ours then return true end
  return adopt and string.byte(stored, 1) == string.byte(ours, 1)
end
