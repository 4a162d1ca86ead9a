//! Splices the shared Lua helpers of `lua/lib/` into the scripts that
//! include them.
//!
//! Redis scripts cannot load code, so a helper several scripts need would
//! otherwise be copied into each of them. Instead a script names it once,
//! after its contract header:
//!
//! ```lua
//! --@include lib/stored
//! ```
//!
//! and the line is replaced by the helper's code (its own comment header
//! dropped) before the script is hashed, loaded or sent. The first include
//! is preceded by `local SCRIPT_NAME = '<name>'`, which `lib/fail` uses to
//! name the script in its errors (a script without includes that names
//! `SCRIPT_NAME`, writing its errors in place, gets it before its first
//! line of code). A helper may itself open with includes of
//! the helpers it builds on; they are spliced in before it, and every
//! helper appears once, so what a script runs is exactly its own text plus
//! the helpers it names and theirs.
//!
//! This file is compiled twice: by `build.rs`, which composes every script
//! under `lua/` into `$OUT_DIR/lua/` (the tree the registry embeds), and by
//! the crate, whose tests hold every composed script to these rules. It uses
//! only `std` for that reason.

/// The directive that pulls in a helper: `--@include lib/<name>`.
pub(crate) const INCLUDE: &str = "--@include ";

/// `source` with each `--@include lib/<name>` line replaced by the helper
/// `lib(name)` returns, or a message saying why it cannot be composed.
///
/// `name` is the script's registry name (`rate/gcra/check`); `lib` is given
/// the helper's path as written (`lib/stored`).
pub(crate) fn compose<'a>(
    name: &str,
    source: &str,
    lib: impl Fn(&str) -> Option<&'a str>,
) -> Result<String, String> {
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'/' || b == b'-')
    {
        return Err(format!(
            "script name {name:?}: only [A-Za-z0-9_/-] may be used"
        ));
    }
    let mut out = String::with_capacity(source.len() + 1024);
    let mut included = Vec::new();
    splice(name, source, &lib, &mut included, &mut out)?;
    if included.is_empty() && source.contains("SCRIPT_NAME") {
        // A script that writes its errors in place, with no helper:
        // SCRIPT_NAME before its first line of code.
        let shebang = match out.split_once('\n') {
            Some((first, _)) if first.starts_with("#!") => first.len() + 1,
            _ => 0,
        };
        let header = out.len() - body(&out[shebang..]).len();
        out.insert_str(header, &format!("local SCRIPT_NAME = '{name}'\n"));
    }
    Ok(out)
}

/// Copies `source` into `out`, expanding its includes depth first: a helper's
/// own includes come before its body, and each helper appears once.
fn splice<'a>(
    name: &str,
    source: &str,
    lib: &impl Fn(&str) -> Option<&'a str>,
    included: &mut Vec<String>,
    out: &mut String,
) -> Result<(), String> {
    for line in source.split_inclusive('\n') {
        let Some(path) = line.trim_end().strip_prefix(INCLUDE).map(str::trim) else {
            out.push_str(line);
            continue;
        };
        if !path.starts_with("lib/") {
            return Err(format!(
                "{name}: `{INCLUDE}{path}`: helpers live under lib/"
            ));
        }
        if included.iter().any(|p| p == path) {
            if source_includes(source, path) > 1 {
                return Err(format!("{name}: {path} is included twice"));
            }
            continue; // already pulled in by another helper
        }
        if included.len() > 64 {
            return Err(format!("{name}: too many helpers (an include cycle?)"));
        }
        let code = lib(path).ok_or_else(|| format!("{name}: no helper lua/{path}.lua"))?;
        if included.is_empty() {
            out.push_str(&format!("local SCRIPT_NAME = '{name}'\n"));
        }
        included.push(path.to_owned());
        let code = body(code);
        let (deps, rest) = split_includes(code);
        let deps: String = deps
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        splice(path, &deps, lib, included, out)?;
        out.push_str(&format!("-- {path}\n"));
        out.push_str(rest);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(())
}

fn source_includes(source: &str, path: &str) -> usize {
    includes(source).filter(|p| *p == path).count()
}

/// A helper body split after its leading `--@include` lines.
fn split_includes(code: &str) -> (&str, &str) {
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        if !line.trim_start().starts_with(INCLUDE) && !line.trim().is_empty() {
            break;
        }
        at += line.len();
    }
    code.split_at(at)
}

/// A helper without its leading comment header and blank lines.
fn body(code: &str) -> &str {
    let mut rest = code;
    while let Some((line, tail)) = rest.split_once('\n') {
        let line = line.trim();
        if line.is_empty() || (line.starts_with("--") && !line.starts_with(INCLUDE)) {
            rest = tail;
        } else {
            break;
        }
    }
    rest
}

/// What a variant's name adds to its script's name: `limits/try_increment`
/// becomes `limits/try_increment@once`. `@` is refused in script names
/// ([`compose`]), so a variant never collides with a script.
pub(crate) const ONCE_SUFFIX: &str = "@once";

/// The error code of a record found with another fingerprint (the same
/// operation id used for another operation); `Error::from_redis` reads it.
pub(crate) const ID_REUSED: &str = "NOLOCK_IDREUSED";

/// The length of a fingerprint: a SHA1 in lowercase hex.
pub(crate) const FINGERPRINT_LEN: usize = 40;

/// The at-most-once variant of the composed script `name`, or `None` for a
/// read-only one (`#!lua flags=no-writes`): running it twice changes nothing.
///
/// The variant runs the script's text unchanged, as the body of a local
/// function, behind a generated wrapper that takes one more key (the
/// record, last in `KEYS`) and two more arguments (the fingerprint and the
/// horizon, last in `ARGV`) and removes them before the body runs, so the
/// body sees exactly the keys and arguments of a plain call. A record with
/// the same fingerprint returns the reply it holds and writes nothing; one
/// with another fingerprint is an error; without a record the body runs and
/// its reply, unless an error, is recorded for `horizon` ms. The shebang
/// line, when there is one, stays first (Redis reads flags only there).
pub(crate) fn once(name: &str, composed: &str) -> Option<String> {
    let (shebang, rest) = match composed.split_once('\n') {
        Some((first, rest)) if first.starts_with("#!") => (Some(first), rest),
        _ => (None, composed),
    };
    let read_only = shebang
        .and_then(|line| line.split_once("flags="))
        .is_some_and(|(_, flags)| flags.split(',').any(|f| f.trim() == "no-writes"));
    if read_only {
        return None;
    }
    let mut out = String::with_capacity(composed.len() + 2048);
    if let Some(line) = shebang {
        out.push_str(line);
        out.push('\n');
    }
    let variant = format!("{name}{ONCE_SUFFIX}");
    out.push_str(&format!(
        "-- {variant}: {name}, applied at most once per operation id (generated by build.rs).
--
-- KEYS     those of {name}, then the record key (last): keys::derive(first key, \"once#<id>\").
-- ARGV     those of {name}, then
--   fingerprint  {FINGERPRINT_LEN} hex characters: the client's SHA1 of the script name, keys and args.
--   horizon      integer milliseconds >= 1: how long the record is kept.
--
-- Reply: the reply of {name}. When the record exists with the same fingerprint,
-- the reply recorded by the first run, and nothing is written; with another
-- fingerprint, the error {ID_REUSED} (naming the first key, never the record
-- key: it holds the id) and nothing is written. Error replies are
-- not recorded (the body wrote nothing), so a retry runs the body again.
--
-- Record: fingerprint .. cmsgpack.pack(reply), SET with PX horizon: one string
-- per id that expires on its own; the body's keys keep their own TTLs.

local once_key = table.remove(KEYS)
local once_horizon = tonumber(table.remove(ARGV))
local once_fingerprint = table.remove(ARGV)
if not once_key or not once_horizon or once_horizon < 1
    or once_horizon ~= math.floor(once_horizon)
    or type(once_fingerprint) ~= 'string' or #once_fingerprint ~= {FINGERPRINT_LEN} then
  return redis.error_reply('ERR nolock {variant}: bad record key, fingerprint or horizon')
end
local once_recorded = redis.call('GET', once_key)
if once_recorded then
  if string.sub(once_recorded, 1, {FINGERPRINT_LEN}) ~= once_fingerprint then
    return redis.error_reply('{ID_REUSED} nolock {name}: the operation id was used for another operation or other arguments (on ' .. tostring(KEYS[1]) .. ')')
  end
  return cmsgpack.unpack(string.sub(once_recorded, {next}))
end

local function once_body()
",
        next = FINGERPRINT_LEN + 1
    ));
    out.push_str(rest);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(
        "end

local once_reply = once_body()
if type(once_reply) ~= 'table' or not once_reply.err then
  redis.call('SET', once_key, once_fingerprint .. cmsgpack.pack(once_reply), 'PX', once_horizon)
end
return once_reply
",
    );
    Some(out)
}

/// The helpers a composed script pulled in, in order (`lib/stored`, ...).
pub(crate) fn includes(source: &str) -> impl Iterator<Item = &str> {
    source
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix(INCLUDE).map(str::trim))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libs(path: &str) -> Option<&'static str> {
        match path {
            "lib/one" => Some("-- lib/one: a helper.\n--\n\nlocal function one() return 1 end\n"),
            "lib/two" => Some("-- lib/two: uses one.\n\n--@include lib/one\n\nlocal function two() return one() + 1 end\n"),
            "lib/loop" => Some("--@include lib/loop2\n"),
            "lib/loop2" => Some("--@include lib/loop\nlocal x = 1\n"),
            _ => None,
        }
    }

    #[test]
    fn an_include_is_replaced_by_the_helper_body_after_the_script_name() {
        let src = "-- t/x: test.\n--@include lib/one\nreturn one()\n";
        let out = compose("t/x", src, libs).unwrap();
        assert_eq!(
            out,
            "-- t/x: test.\nlocal SCRIPT_NAME = 't/x'\n-- lib/one\nlocal function one() return 1 end\nreturn one()\n"
        );
        assert_eq!(includes(src).collect::<Vec<_>>(), ["lib/one"]);
    }

    #[test]
    fn a_helper_brings_the_helpers_it_builds_on_first_and_each_once() {
        let src = "-- t/z: test.\n--@include lib/two\n--@include lib/one\nreturn two()\n";
        let out = compose("t/z", src, libs).unwrap();
        assert_eq!(
            out,
            "-- t/z: test.\nlocal SCRIPT_NAME = 't/z'\n-- lib/one\nlocal function one() return 1 end\n\
             -- lib/two\nlocal function two() return one() + 1 end\nreturn two()\n"
        );
    }

    #[test]
    fn a_script_without_includes_is_unchanged() {
        let src = "#!lua flags=no-writes\n-- t/y: test.\nreturn 1";
        assert_eq!(compose("t/y", src, libs).unwrap(), src);
    }

    #[test]
    fn a_script_naming_itself_without_includes_gets_its_name_before_its_code() {
        let src = "#!lua flags=no-writes\n-- t/n: test.\n--\n\nreturn SCRIPT_NAME\n";
        assert_eq!(
            compose("t/n", src, libs).unwrap(),
            "#!lua flags=no-writes\n-- t/n: test.\n--\n\nlocal SCRIPT_NAME = 't/n'\nreturn SCRIPT_NAME\n"
        );
        let plain = "-- t/m: test.\nreturn SCRIPT_NAME";
        assert_eq!(
            compose("t/m", plain, libs).unwrap(),
            "-- t/m: test.\nlocal SCRIPT_NAME = 't/m'\nreturn SCRIPT_NAME"
        );
    }

    #[test]
    fn a_variant_keeps_the_shebang_first_and_runs_the_body_unchanged() {
        let src = "#!lua flags=allow-oom\n-- t/w: test.\nreturn {1}\n";
        let out = once("t/w", src).unwrap();
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("#!lua flags=allow-oom"));
        assert!(lines.next().unwrap().starts_with("-- t/w@once: t/w, "));
        assert!(out.contains("local function once_body()\n-- t/w: test.\nreturn {1}\nend\n"));
        assert!(out.ends_with("return once_reply\n"));
        let plain = once("t/v", "-- t/v: test.\nreturn 1").unwrap();
        assert!(plain.starts_with("-- t/v@once: t/v, "));
        assert!(plain.contains("return 1\nend\n"));
        assert_eq!(once("t/r", "#!lua flags=no-writes\nreturn 1"), None);
        assert!(
            compose("t/x@once", "return 1", libs).is_err(),
            "no script can take a variant's name"
        );
    }

    #[test]
    fn bad_includes_are_errors() {
        assert!(compose("t/x", "--@include lib/none\n", libs).is_err());
        assert!(compose("t/x", "--@include lib/one\n--@include lib/one\n", libs).is_err());
        assert!(compose("t/x", "--@include other/one\n", libs).is_err());
        assert!(
            compose("t/x", "--@include lib/loop\nreturn 1\n", libs).is_ok(),
            "each helper once"
        );
        assert!(compose("t/x'..", "return 1", libs).is_err());
    }
}
