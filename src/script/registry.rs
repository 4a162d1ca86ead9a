use std::borrow::Cow;
use std::sync::{LazyLock, OnceLock};

use include_dir::{include_dir, Dir};
use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Value};

use super::ScriptDir;
use crate::{Error, Result};

/// The scripts of `lua/`, each composed with the helpers it includes from
/// `lua/lib/` by `build.rs` (see `compose.rs`); the helpers themselves are
/// not scripts and are not in this tree.
static LUA: Dir<'static> = include_dir!("$OUT_DIR/lua");

static REGISTRY: LazyLock<Vec<Script>> = LazyLock::new(|| {
    let mut scripts = Vec::new();
    collect(&LUA, &mut scripts);
    scripts.sort_by_key(|script| script.name);
    scripts
});

fn collect(dir: &'static Dir<'static>, out: &mut Vec<Script>) {
    for file in dir.files() {
        let path = file.path().to_str();
        let name = path.and_then(|p| p.strip_suffix(".lua"));
        // Non-UTF-8 files cannot be scripts; the registry test would show them missing.
        if let (Some(name), Some(source)) = (name, file.contents_utf8()) {
            out.push(Script::embedded(name, source));
        }
    }
    for sub in dir.dirs() {
        collect(sub, out);
    }
}

/// One embedded Lua script: its name, source and SHA1.
///
/// nolock's own scripts are in [`Scripts`]; yours are in a
/// [`crate::script::ScriptDir`].
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    /// Borrowed from the binary, or composed at startup (a script of a
    /// [`crate::script::ScriptDir`] that includes a helper).
    source: Cow<'static, str>,
    /// Read from the source once, on first use: every call needs both.
    derived: OnceLock<Derived>,
}

#[derive(Debug)]
struct Derived {
    sha1: String,
    read_only: bool,
}

impl Script {
    pub(crate) const fn embedded(name: &'static str, source: &'static str) -> Self {
        Script {
            name,
            source: Cow::Borrowed(source),
            derived: OnceLock::new(),
        }
    }

    /// A script composed at run time (see `user.rs`).
    pub(crate) fn composed(name: &'static str, source: Cow<'static, str>) -> Self {
        Script {
            name,
            source,
            derived: OnceLock::new(),
        }
    }

    fn derived(&self) -> &Derived {
        self.derived.get_or_init(|| Derived {
            sha1: sha1_smol::Sha1::from(self.source.as_bytes())
                .digest()
                .to_string(),
            read_only: self
                .source
                .lines()
                .next()
                .and_then(|line| line.strip_prefix("#!lua"))
                .and_then(|rest| rest.trim().strip_prefix("flags="))
                .is_some_and(|flags| flags.split(',').any(|flag| flag.trim() == "no-writes")),
        })
    }

    /// The stable name: the path under `lua/` (or under your script
    /// directory) without `.lua`, e.g. `limits/try_increment`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source, exactly as sent to `SCRIPT LOAD` and `EVAL` (with
    /// the helpers it includes spliced in).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The lowercase hex SHA1 of the source, as Redis computes it. Computed once.
    pub fn sha1(&self) -> &str {
        &self.derived().sha1
    }

    /// True when the script declares `#!lua flags=no-writes`; it is then run with
    /// `EVALSHA_RO`/`EVAL_RO`, which replicas accept.
    pub fn is_read_only(&self) -> bool {
        self.derived().read_only
    }
}

/// What [`Scripts::load`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Loaded {
    /// The names of the scripts now cached on the server: nolock's in
    /// registry order, then those of each directory passed to
    /// [`Scripts::load_with`].
    pub scripts: Vec<&'static str>,
    /// True when the server has `SET ... IFEQ` (Valkey 8.1 or later), so
    /// [`crate::cas::compare_and_set`] with an expected value runs it instead
    /// of its script, in this process from now on (see the `cas` docs).
    pub set_ifeq: bool,
}

/// The registry of every script embedded from `lua/`.
#[derive(Debug, Clone, Copy)]
pub struct Scripts;

impl Scripts {
    /// Every embedded script, sorted by name.
    pub fn all() -> &'static [Script] {
        &REGISTRY
    }

    /// The script called `name` (e.g. `"limits/try_increment"`), if embedded.
    pub fn get(name: &str) -> Option<&'static Script> {
        REGISTRY.iter().find(|script| script.name == name)
    }

    /// Cache every embedded script on the server, or on every node of a
    /// cluster, and check each returned SHA1 against the locally computed one.
    ///
    /// On a single server this is one pipelined round trip: a `SCRIPT LOAD`
    /// per script, plus `INFO cluster`. When that server says it is part of
    /// a cluster (or does not answer `INFO`), each script is then loaded
    /// again with its own `SCRIPT LOAD`, which a redis-rs cluster connection
    /// sends to every node, primaries and replicas alike (a pipeline would
    /// reach only one node). Replicas need the scripts too: read-only
    /// operations may be served there.
    ///
    /// Calling it is optional: without it, the first call of each script on
    /// each node costs one extra round trip (the `NOSCRIPT` fallback, which
    /// loads the script the same way). Call it at
    /// startup, and again after reconnects or failovers if you want to avoid
    /// that ([`crate::stats`] counts the fallbacks).
    ///
    /// # Errors
    ///
    /// [`Error::ShaMismatch`] when the server hashes a source differently;
    /// [`Error::Redis`] / [`Error::Indeterminate`] when a node fails to answer
    /// (loading is idempotent, so retrying is always safe).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let mut conn = client.get_multiplexed_async_connection().await?;
    /// let loaded = nolock::Scripts::load(&mut conn).await?;
    /// println!("{} scripts cached", loaded.scripts.len());
    ///
    /// // The same call loads every node of a cluster.
    /// let cluster = redis::cluster::ClusterClient::builder(["redis://127.0.0.1:7000/"])
    ///     .retries(0) // see the crate docs: never replay a script
    ///     .build()?;
    /// let mut conn = cluster.get_async_connection().await?;
    /// nolock::Scripts::load(&mut conn).await?;
    /// # Ok(()) }
    /// ```
    pub async fn load<C>(conn: &mut C) -> Result<Loaded>
    where
        C: ConnectionLike + Send,
    {
        Scripts::load_with(conn, &[]).await
    }

    /// [`Scripts::load`], and every script of your own directories with it,
    /// in the same round trip on a single server.
    ///
    /// # Errors
    ///
    /// As [`Scripts::load`], and [`Error::ScriptSource`] (nothing sent) when
    /// a script of `dirs` cannot be composed.
    ///
    /// # Example
    ///
    /// ```no_run
    /// static MY_SCRIPTS: nolock::script::ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/lua");
    ///
    /// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
    /// let loaded = nolock::Scripts::load_with(conn, &[&MY_SCRIPTS]).await?;
    /// println!("{} scripts cached", loaded.scripts.len());
    /// # Ok(()) }
    /// ```
    pub async fn load_with<C>(conn: &mut C, dirs: &[&'static ScriptDir]) -> Result<Loaded>
    where
        C: ConnectionLike + Send,
    {
        let mut scripts: Vec<&'static Script> = Scripts::all().iter().collect();
        for dir in dirs {
            scripts.extend(dir.scripts()?);
        }
        let mut pipe = redis::pipe();
        for script in &scripts {
            pipe.cmd("SCRIPT").arg("LOAD").arg(script.source());
        }
        // Both sections in one INFO (Redis >= 7.0): which deployment, and
        // which native commands the server has.
        pipe.cmd("INFO").arg("server").arg("cluster");
        let mut replies: Vec<Value> = pipe
            .ignore_errors()
            .query_async(conn)
            .await
            .map_err(Error::from_redis)?;
        // On a cluster connection INFO may come back as one reply per node,
        // which is not a string: then nothing native is recorded.
        let info = replies
            .pop()
            .and_then(|info| String::from_redis_value(info).ok());
        let set_ifeq = info.as_deref().is_some_and(super::native::detect);
        if replies.len() != scripts.len() {
            return Err(Error::UnexpectedReply {
                script: "SCRIPT LOAD",
                detail: format!("{} replies for {} scripts", replies.len(), scripts.len()),
            });
        }
        for (script, reply) in scripts.iter().zip(replies) {
            check_sha(script, reply)?;
        }

        let single_node =
            info.is_some_and(|info| info.lines().any(|line| line.trim() == "cluster_enabled:0"));
        if !single_node {
            for script in &scripts {
                let reply = conn
                    .req_packed_command(redis::cmd("SCRIPT").arg("LOAD").arg(script.source()))
                    .await
                    .map_err(Error::from_redis)?;
                check_sha(script, reply)?;
            }
        }
        Ok(Loaded {
            scripts: scripts.iter().map(|script| script.name()).collect(),
            set_ifeq,
        })
    }
}

/// Check one `SCRIPT LOAD` reply against the script's local SHA1.
fn check_sha(script: &Script, reply: Value) -> Result<()> {
    let server = String::from_redis_value(reply.extract_error().map_err(Error::from_redis)?)
        .map_err(|e| Error::UnexpectedReply {
            script: "SCRIPT LOAD",
            detail: e.to_string(),
        })?;
    if server.eq_ignore_ascii_case(script.sha1()) {
        Ok(())
    } else {
        Err(Error::ShaMismatch {
            script: script.name,
            local: script.sha1().to_owned(),
            server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_every_lua_file_by_its_path() {
        let names: Vec<_> = Scripts::all().iter().map(Script::name).collect();
        assert!(names.contains(&"limits/try_increment"), "{names:?}");
        assert!(names
            .iter()
            .all(|n| !n.ends_with(".lua") && !n.starts_with('/')));
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, names, "sorted and unique");
    }

    #[test]
    fn sha1_matches_a_known_digest() {
        // `echo -n 'return 1' | sha1sum`
        let script = Script::embedded("t", "return 1");
        assert_eq!(script.sha1(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    }

    #[test]
    fn read_only_flag_is_read_from_the_shebang() {
        assert!(Script::embedded("t", "#!lua flags=no-writes\nreturn 1").is_read_only());
        assert!(Script::embedded("t", "#!lua flags=allow-oom, no-writes\n").is_read_only());
        assert!(!Script::embedded("t", "#!lua flags=allow-oom\nreturn 1").is_read_only());
        assert!(!Script::embedded("t", "-- no-writes\nreturn 1").is_read_only());
    }

    /// The `lua/` tree as written, helpers and `--@include` lines included.
    static RAW: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/lua");

    fn raw(path: &str) -> &'static str {
        RAW.get_file(path)
            .and_then(|f| f.contents_utf8())
            .unwrap_or_else(|| panic!("lua/{path}"))
    }

    /// The names of the functions a helper file defines.
    fn functions(code: &str) -> Vec<&str> {
        code.lines()
            .filter_map(|l| l.trim_start().strip_prefix("local function "))
            .filter_map(|rest| rest.split('(').next())
            .collect()
    }

    /// Lua code without its `--` comments (strings in nolock scripts hold no `--`).
    fn code(source: &str) -> String {
        source
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn calls(code: &str, function: &str) -> bool {
        code.match_indices(&format!("{function}(")).any(|(at, _)| {
            !code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.' || c == ':')
        })
    }

    #[test]
    fn every_script_opens_with_its_contract_and_includes_exactly_the_helpers_it_calls() {
        let libs: Vec<(String, &str)> = RAW
            .get_dir("lib")
            .expect("lua/lib")
            .files()
            .filter_map(|f| {
                let path = f.path().to_str()?.strip_suffix(".lua")?.to_owned();
                Some((path, f.contents_utf8()?))
            })
            .collect();
        assert!(
            libs.len() >= 5,
            "{:?}",
            libs.iter().map(|l| &l.0).collect::<Vec<_>>()
        );
        for (path, code) in &libs {
            assert!(
                code.starts_with(&format!("-- {path}: ")),
                "lua/{path}.lua needs a header"
            );
            assert!(
                !functions(code).is_empty() || code.contains("local "),
                "{path}"
            );
        }
        for script in Scripts::all() {
            let name = script.name();
            assert!(!name.starts_with("lib/"), "helpers are not scripts: {name}");
            let composed = script.source();
            let contract = composed
                .lines()
                .find(|l| !l.starts_with("#!lua"))
                .unwrap_or_default();
            assert!(
                contract.starts_with(&format!("-- {name}: ")),
                "lua/{name}.lua must open with its contract: {contract:?}"
            );
            if let Some(base) = name.strip_suffix(super::super::compose::ONCE_SUFFIX) {
                // A generated variant runs its script's composed text
                // unchanged, behind the same shebang; that text is held
                // to the rules below under its own name.
                let base = Scripts::get(base).unwrap_or_else(|| panic!("{name} without {base}"));
                assert!(!base.is_read_only(), "{name}");
                let body = match base.source().split_once('\n') {
                    Some((first, rest)) if first.starts_with("#!") => {
                        assert!(composed.starts_with(&format!("{first}\n")), "{name}");
                        rest
                    }
                    _ => base.source(),
                };
                assert!(
                    composed.contains(body),
                    "{name} runs {} unchanged",
                    base.name()
                );
                continue;
            }
            let own = raw(&format!("{name}.lua"));
            let included: Vec<&str> = super::super::compose::includes(own).collect();
            let own_code = code(own);
            let own_functions = functions(own);
            for (path, lib) in &libs {
                let used = functions(lib)
                    .into_iter()
                    .filter(|f| !own_functions.contains(f))
                    .any(|f| calls(&own_code, f));
                let pulled = included.contains(&path.as_str());
                assert_eq!(
                    used,
                    pulled,
                    "lua/{name}.lua {} {path} (used: {used})",
                    if pulled {
                        "includes"
                    } else {
                        "does not include"
                    }
                );
                // A helper written again in a script is the copy the prelude replaces.
                for f in functions(lib) {
                    assert!(
                        !own_functions.contains(&f),
                        "lua/{name}.lua redefines {f} of {path}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_script_that_writes_has_an_at_most_once_variant() {
        let suffix = super::super::compose::ONCE_SUFFIX;
        for script in Scripts::all() {
            if script.name().ends_with(suffix) {
                continue;
            }
            let variant = Scripts::get(&format!("{}{suffix}", script.name()));
            assert_eq!(
                variant.is_some(),
                !script.is_read_only(),
                "{}",
                script.name()
            );
            if let Some(variant) = variant {
                assert!(!variant.is_read_only());
                assert_ne!(variant.sha1(), script.sha1());
            }
        }
    }

    #[test]
    fn embedded_statics_match_the_registry() {
        let from_macro = crate::script::embedded!("limits/try_increment");
        let from_dir = Scripts::get("limits/try_increment").map(Script::source);
        assert_eq!(Some(from_macro.source()), from_dir);
    }
}
