-- lib/fail: the error every nolock script returns for bad input or foreign state.
--
-- fail(msg) -> an error reply "ERR nolock <script name>: <msg>". Scripts
-- return it before their first write, so the caller's error is definite:
-- nothing was written. SCRIPT_NAME is defined by the composer.

local function fail(msg)
  return redis.error_reply('ERR nolock ' .. SCRIPT_NAME .. ': ' .. msg)
end
