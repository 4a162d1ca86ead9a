//! Your own scripts through nolock's engine: [`ScriptDir`], the registry
//! of a directory of yours; [`Call`] (in `call.rs`) runs them.
//!
//! A directory of Lua files is embedded at compile time with
//! [`crate::scripts!`] (the same `include_dir` mechanism as nolock's own
//! `lua/`) and follows the same conventions: a script is known by its path
//! without `.lua`, `#!lua flags=no-writes` on its first line makes it
//! read-only (run with `EVALSHA_RO`, which replicas serve), and
//! `--@include lib/<name>` after its header splices in a helper, either one
//! of nolock's `lua/lib/` (`lib/fail`, `lib/args`, `lib/stored`,
//! `lib/time`, ...) or one of yours under `<dir>/lib/` (yours first). Files under `lib/` are
//! helpers, not scripts.
//!
//! Composition runs once, on first use of the directory, and the SHA1 is
//! taken over the composed text, as for nolock's scripts.
//!
//! A [`Call`] runs through the same code as nolock's own operations (see the
//! [module docs](super)): cross-slot check before I/O, `EVALSHA` then, on
//! `NOSCRIPT`, `SCRIPT LOAD` + `EVALSHA` in one pipeline (`EVAL` only where
//! loading is refused; counted in [`crate::stats`]), the `MOVED`/`READONLY`
//! resend, definite and indeterminate errors; it is an
//! [`Operation`](crate::Operation), so it goes in a [`crate::Batch`] with
//! per-entry `NOSCRIPT` recovery.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

use include_dir::{include_dir, Dir};

use super::{compose, Call, Script};
use crate::{Error, Result};

/// nolock's helpers as written (`lua/lib/`), for composing your scripts at
/// run time; nolock's own scripts were composed by `build.rs`.
static LIB: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/lua/lib");

/// A directory of your own Lua scripts, embedded at compile time by
/// [`crate::scripts!`]; keep it in a `static`.
///
/// # Example
///
/// ```no_run
/// // Your crate's lua/leaderboard/add.lua (as in nolock's
/// // examples/lua/leaderboard/add.lua) replies {score, rank}.
/// static MY_SCRIPTS: nolock::script::ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/lua");
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// nolock::Scripts::load_with(conn, &[&MY_SCRIPTS]).await?; // optional, at startup
/// let (score, rank): (i64, i64) = MY_SCRIPTS
///     .call("leaderboard/add", &["board:{weekly}"])?
///     .arg("alice")
///     .arg(10)
///     .run(conn)
///     .await?;
/// # Ok(()) }
/// ```
pub struct ScriptDir {
    dir: Dir<'static>,
    /// Composed on first use: the scripts sorted by name, or the first file
    /// that could not be composed and why.
    scripts: OnceLock<std::result::Result<Vec<Script>, (String, String)>>,
}

impl ScriptDir {
    /// Use [`crate::scripts!`].
    #[doc(hidden)]
    pub const fn from_dir(dir: Dir<'static>) -> Self {
        ScriptDir {
            dir,
            scripts: OnceLock::new(),
        }
    }

    /// Every script of the directory, sorted by name (helpers under `lib/`
    /// are not scripts).
    ///
    /// # Errors
    ///
    /// [`Error::ScriptSource`] when a script cannot be composed (a missing
    /// helper, a helper included twice, a name outside `[A-Za-z0-9_/-]`, a
    /// file that is not UTF-8). It is a mistake in the directory, the same
    /// on every call: a unit test calling this catches it before deployment.
    pub fn scripts(&'static self) -> Result<&'static [Script]> {
        match self.scripts.get_or_init(|| compose_dir(&self.dir)) {
            Ok(scripts) => Ok(scripts),
            Err((script, reason)) => Err(Error::ScriptSource {
                script: script.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// The script called `name`: its path under the directory without
    /// `.lua` (`"leaderboard/add"`).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownScript`] when there is none ([`crate::checked_script!`] makes
    /// that a compile error); [`Error::ScriptSource`] as for
    /// [`ScriptDir::scripts`].
    pub fn get(&'static self, name: &str) -> Result<&'static Script> {
        let scripts = self.scripts()?;
        scripts
            .binary_search_by(|script| script.name().cmp(name))
            .map(|at| &scripts[at])
            .map_err(|_| Error::UnknownScript { name: name.into() })
    }

    /// A call of the script `name` with these keys; add arguments with
    /// [`Call::arg`], then [`Call::run`] it or push it into a
    /// [`crate::Batch`]. `T` is the type its reply decodes into.
    ///
    /// # Errors
    ///
    /// As [`ScriptDir::get`]. Nothing is sent.
    pub fn call<T>(&'static self, name: &str, keys: &[&str]) -> Result<Call<T>> {
        Ok(Call::new(self.get(name)?, keys))
    }
}

impl fmt::Debug for ScriptDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Option<Vec<&str>> = match self.scripts.get() {
            Some(Ok(scripts)) => Some(scripts.iter().map(Script::name).collect()),
            _ => None,
        };
        f.debug_struct("ScriptDir")
            .field("scripts", &names)
            .finish_non_exhaustive()
    }
}

/// The scripts of `dir`, each composed with the helpers it includes.
fn compose_dir(dir: &Dir<'static>) -> std::result::Result<Vec<Script>, (String, String)> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let (libs, sources): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|(name, _)| name.starts_with("lib/"));
    let lib = |path: &str| {
        libs.iter()
            .find(|(name, _)| *name == path)
            .map(|(_, code)| *code)
            .or_else(|| nolock_lib(path))
    };
    let mut scripts = Vec::with_capacity(sources.len());
    for (name, source) in sources {
        let composed = compose::compose(name, source, lib)
            .map_err(|reason| (format!("{name}.lua"), reason))?;
        // No include: keep the text in the binary rather than a copy.
        let source = if composed == source {
            Cow::Borrowed(source)
        } else {
            Cow::Owned(composed)
        };
        scripts.push(Script::composed(name, source));
    }
    scripts.sort_by_key(|script| script.name());
    Ok(scripts)
}

/// Every `.lua` file under `dir`: its path without `.lua`, and its text.
fn walk(
    dir: &Dir<'static>,
    out: &mut Vec<(&'static str, &'static str)>,
) -> std::result::Result<(), (String, String)> {
    for file in dir.files() {
        let path = file.path();
        if path.extension().is_none_or(|ext| ext != "lua") {
            continue;
        }
        let shown = path.display().to_string();
        let name = path
            .to_str()
            .and_then(|p| p.strip_suffix(".lua"))
            .ok_or_else(|| (shown.clone(), "the path is not UTF-8".to_owned()))?;
        let source = file
            .contents_utf8()
            .ok_or_else(|| (shown, "the file is not UTF-8".to_owned()))?;
        out.push((name, source));
    }
    for sub in dir.dirs() {
        walk(sub, out)?;
    }
    Ok(())
}

/// nolock's helper `lib/<name>`, as written.
fn nolock_lib(path: &str) -> Option<&'static str> {
    let name = path.strip_prefix("lib/")?;
    LIB.get_file(format!("{name}.lua"))?.contents_utf8()
}

/// A [`ScriptDir`] of the Lua files under `dir`, embedded at compile time
/// (the `include_dir` syntax: `"$CARGO_MANIFEST_DIR/lua"`). Use it to
/// initialize a `static`.
///
/// ```no_run
/// static MY_SCRIPTS: nolock::script::ScriptDir = nolock::scripts!("$CARGO_MANIFEST_DIR/lua");
/// ```
///
/// Your crate needs no `include_dir` dependency of its own. An edit to an
/// embedded file rebuilds your crate (each file is embedded with
/// `include_bytes!`); a file added or removed is noticed only when the crate
/// is rebuilt for another reason, unless your `build.rs` prints
/// `cargo:rerun-if-changed=lua` (an `include_dir` limitation).
#[macro_export]
macro_rules! scripts {
    // `tt`, not `literal`: a `literal` fragment reaches the proc macro
    // wrapped in an invisible group, which `include_dir!` refuses.
    ($dir:tt) => {{
        // The expansion of `include_dir!` names `include_dir::...`: resolve
        // it to nolock's copy, so the caller needs no dependency of its own.
        use $crate::__private::include_dir;
        $crate::script::ScriptDir::from_dir(include_dir::include_dir!($dir))
    }};
}

/// `MY_SCRIPTS.get(name)` with the name checked at compile time: a
/// misspelt or missing script does not build.
///
/// Arguments: the `static` [`ScriptDir`], its directory relative to your
/// `Cargo.toml` (`"lua"` for `scripts!("$CARGO_MANIFEST_DIR/lua")`), and the
/// script's name. Returns `nolock::Result<&'static Script>`; it can still
/// be [`crate::Error::ScriptSource`] (a bad include), or
/// [`crate::Error::UnknownScript`] if the directory given here is not the
/// one the `static` embeds.
///
/// ```no_run
/// // In your crate: scripts!("$CARGO_MANIFEST_DIR/lua") and script!(MY_SCRIPTS, "lua", ...).
/// static MY_SCRIPTS: nolock::script::ScriptDir =
///     nolock::scripts!("$CARGO_MANIFEST_DIR/examples/lua");
///
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let add = nolock::checked_script!(MY_SCRIPTS, "examples/lua", "leaderboard/add")?;
/// let (score, rank): (i64, i64) = nolock::script::Call::new(add, &["board:{weekly}"])
///     .arg("alice")
///     .arg(10)
///     .run(conn)
///     .await?;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! checked_script {
    ($scripts:path, $dir:literal, $name:literal) => {{
        const _: &str = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/",
            $dir,
            "/",
            $name,
            ".lua"
        ));
        $crate::script::ScriptDir::get(&$scripts, $name)
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    static FIXTURES: ScriptDir = crate::scripts!("$CARGO_MANIFEST_DIR/tests/fixtures/lua");

    #[test]
    fn a_directory_is_composed_with_nolock_and_own_helpers() {
        let names: Vec<_> = FIXTURES
            .scripts()
            .unwrap()
            .iter()
            .map(Script::name)
            .collect();
        assert!(names.contains(&"counter/add"), "{names:?}");
        assert!(
            names.iter().all(|n| !n.starts_with("lib/")),
            "helpers are not scripts: {names:?}"
        );
        let checked = FIXTURES.get("counter/checked_add").unwrap();
        assert!(checked.source().contains("local function fail("));
        assert!(checked
            .source()
            .contains("local SCRIPT_NAME = 'counter/checked_add'"));
        assert!(!checked.source().contains("--@include"));
        let sha = sha1_smol::Sha1::from(checked.source()).digest().to_string();
        assert_eq!(checked.sha1(), sha, "SHA1 over the composed text");
        assert!(FIXTURES.get("counter/read").unwrap().is_read_only());
        assert!(!FIXTURES.get("counter/add").unwrap().is_read_only());
    }

    #[test]
    fn an_unknown_name_is_a_typed_error() {
        match FIXTURES.get("counter/nope") {
            Err(Error::UnknownScript { name }) => assert_eq!(name, "counter/nope"),
            other => panic!("{other:?}"),
        }
        let err = FIXTURES.call::<i64>("nope", &[]).unwrap_err();
        assert!(err.is_invalid_input() && err.is_definite());
    }

    #[test]
    fn the_checked_macro_finds_the_same_script() {
        let by_macro =
            crate::checked_script!(FIXTURES, "tests/fixtures/lua", "counter/add").unwrap();
        assert!(std::ptr::eq(by_macro, FIXTURES.get("counter/add").unwrap()));
    }

    #[test]
    fn a_bad_include_is_a_typed_error_for_the_whole_directory() {
        static BAD: ScriptDir = ScriptDir::from_dir(Dir::new(
            "",
            &[include_dir::DirEntry::File(include_dir::File::new(
                "x/bad.lua",
                b"-- x/bad: test.\n--@include lib/none\nreturn 1\n",
            ))],
        ));
        match BAD.scripts() {
            Err(Error::ScriptSource { script, reason }) => {
                assert_eq!(script, "x/bad.lua");
                assert!(reason.contains("lib/none"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(BAD.get("x/bad"), Err(Error::ScriptSource { .. })));
    }

    #[tokio::test]
    async fn loading_a_bad_directory_sends_nothing() {
        static BAD: ScriptDir = ScriptDir::from_dir(Dir::new(
            "",
            &[include_dir::DirEntry::File(include_dir::File::new(
                "bad.name.lua",
                b"return 1\n",
            ))],
        ));
        let mut conn = crate::script::invoke::tests::NoIo::default();
        let err = crate::Scripts::load_with(&mut conn, &[&FIXTURES, &BAD])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ScriptSource { .. }), "{err}");
        assert_eq!(conn.sent, 0);
    }
}
