#!lua flags=no-writes
-- leaderboard/top: the ARGV[1] best members of board KEYS[1]; reply: {member, score, ...}.
--
-- KEYS[1]  the board, a sorted set (member -> points)
-- ARGV[1]  how many, a canonical decimal integer in [1, 100]
-- Reply:   a flat array of member names and scores, best first.
-- Example: top('board', 2) -> {'alice', '30', 'bob', '20'}.
--
-- Read-only (flags=no-writes): run with EVALSHA_RO, which replicas serve.
--@include lib/args
--@include lib/fail
local n = arg_int(1, 1, 100)
if not n then
  return fail('n must be an integer in 1..100')
end
return redis.call('ZREVRANGE', KEYS[1], 0, n - 1, 'WITHSCORES')
