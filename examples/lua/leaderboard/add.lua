-- leaderboard/add: add ARGV[2] points to member ARGV[1] of board KEYS[1]; reply: {score, rank}.
--
-- KEYS[1]  the board, a sorted set (member -> points)
-- ARGV[1]  the member, a non-empty string
-- ARGV[2]  the points, a canonical decimal integer in [1, 1000000]
-- Reply:   {integer, integer}: the member's new score, and its rank (0 = first).
-- Example: add('board', 'alice', 10) on an empty board -> {10, 0}.
--
-- Checks before the first write (lib/args, lib/fail), so an error reply means
-- nothing was written: nolock reports it as a definite error.
--@include lib/args
--@include lib/fail
local points = arg_int(2, 1, 1000000)
if ARGV[1] == '' then
  return fail('member must not be empty')
end
if not points then
  return fail('points must be an integer in 1..1000000')
end
local score = redis.call('ZINCRBY', KEYS[1], points, ARGV[1])
return {tonumber(score), redis.call('ZREVRANK', KEYS[1], ARGV[1])}
