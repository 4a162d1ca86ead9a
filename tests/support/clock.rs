//! Servers whose clock the test steps: `redis-server` under libfaketime
//! (Debian package `faketime`), reading its offset from a file on every
//! clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE`), so a test
//! moves the server's clock forward or back while it runs.
//!
//! libfaketime does not work with every build: the Debian `redis-server`
//! 7.0 (its jemalloc reads the clock while libfaketime initialises) fails
//! to start under it. [`SkewedServer::start`] therefore probes the binaries
//! it can find: `$NOLOCK_FAKETIME_SERVER`, the test server
//! (`$NOLOCK_REDIS_SERVER` or `redis-server`), then each
//! `../shared/servers/*/bin/redis-server`; it takes the first whose clock
//! moves with the file. Without libfaketime or such a server it says why,
//! and the test is skipped (failed under `CI=true`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::server::{redis_server_binary, RedisServer};

const LIBS: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// Binaries found not to run under libfaketime, in this test process.
static FAILED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A server and the file that sets its clock's offset.
pub struct SkewedServer {
    pub server: RedisServer,
    pub clock: ClockFile,
}

/// The file a server under libfaketime reads its clock's offset from, and
/// the server's address (to see the offset take effect). Removed on drop.
pub struct ClockFile {
    path: PathBuf,
    url: String,
}

impl SkewedServer {
    /// A server under libfaketime at offset 0, or why there is none.
    pub fn start(args: &[&str]) -> Result<SkewedServer, String> {
        let lib = LIBS
            .iter()
            .find(|l| Path::new(l).exists())
            .ok_or("libfaketime is not installed (Debian: apt-get install faketime)")?;
        let mut candidates: Vec<String> = Vec::new();
        if let Ok(s) = std::env::var("NOLOCK_FAKETIME_SERVER") {
            candidates.push(s);
        }
        candidates.push(redis_server_binary());
        let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/servers");
        if let Ok(dirs) = std::fs::read_dir(&shared) {
            let mut found: Vec<String> = dirs
                .flatten()
                .map(|d| d.path().join("bin/redis-server"))
                .filter(|p| p.exists())
                .map(|p| p.display().to_string())
                .collect();
            found.sort();
            candidates.extend(found);
        }
        let mut why = Vec::new();
        for binary in candidates {
            if FAILED.lock().unwrap().contains(&binary) {
                continue;
            }
            let clock = std::env::temp_dir().join(format!(
                "nolock-clock-{}-{}",
                std::process::id(),
                super::prefix("clock").replace(':', "-")
            ));
            std::fs::write(&clock, "+100").map_err(|e| e.to_string())?;
            let env = vec![
                ("LD_PRELOAD".to_owned(), (*lib).to_owned()),
                (
                    "FAKETIME_TIMESTAMP_FILE".to_owned(),
                    clock.display().to_string(),
                ),
                ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
                // Only the wall clock steps: the server's timers (expiry
                // cycles, blocked clients' timeouts) run on the monotonic
                // one, as on a real server whose clock is set.
                ("DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
            ];
            match RedisServer::start_tries(Some(&binary), &env, args, 1, Duration::from_secs(3)) {
                Ok(server) => {
                    let clock = ClockFile {
                        path: clock,
                        url: server.url(),
                    };
                    let skewed = SkewedServer { server, clock };
                    // The clock must follow the file: +100 s now, then 0.
                    let ahead = skewed.offset_seen();
                    if (95.0..105.0).contains(&ahead) {
                        skewed.set(0.0);
                        return Ok(skewed);
                    }
                    why.push(format!("{binary}: clock {ahead:.1} s off, not 100"));
                    FAILED.lock().unwrap().push(binary);
                }
                Err(e) => {
                    // No ClockFile owns this one yet.
                    let _ = std::fs::remove_file(&clock);
                    why.push(format!("{binary}: {}", e.lines().next().unwrap_or("")));
                    FAILED.lock().unwrap().push(binary);
                }
            }
        }
        Err(format!(
            "no redis-server runs under libfaketime: {}",
            why.join("; ")
        ))
    }

    /// Sets the server's clock `seconds` away from the real one: see
    /// [`ClockFile::set`].
    pub fn set(&self, seconds: f64) {
        self.clock.set(seconds);
    }

    /// The server's clock minus this process's, in seconds.
    pub fn offset_seen(&self) -> f64 {
        self.clock.offset_seen().expect("read the server's TIME")
    }
}

impl ClockFile {
    /// Sets the server's clock `seconds` away from the real one (negative:
    /// behind). Panics if the server does not follow: see
    /// [`ClockFile::try_set`].
    pub fn set(&self, seconds: f64) {
        if let Err(e) = self.try_set(seconds) {
            panic!("{e}");
        }
    }

    /// Sets the offset, then waits until the server's `TIME` shows it: see
    /// [`ClockSet::apply`].
    pub fn try_set(&self, seconds: f64) -> Result<(), String> {
        self.setter(seconds).apply()
    }

    /// The setting of `seconds`, as a value to apply elsewhere (on a
    /// blocking thread: it waits for the server).
    pub fn setter(&self, seconds: f64) -> ClockSet {
        ClockSet {
            path: self.path.clone(),
            url: self.url.clone(),
            seconds,
        }
    }

    /// The server's clock minus this process's, in seconds.
    pub fn offset_seen(&self) -> Result<f64, String> {
        offset_seen(&self.url)
    }
}

/// An offset to give a server's clock ([`ClockFile::setter`]).
pub struct ClockSet {
    path: PathBuf,
    url: String,
    seconds: f64,
}

impl ClockSet {
    /// Writes the offset, then waits until the server's `TIME` shows it
    /// (within 5 ms; at most 5 s). The file is replaced whole (written
    /// beside it, then renamed), so the server never reads it empty or half
    /// written; the wait is there because libfaketime can be seen to read
    /// a file changed twice within a moment late.
    pub fn apply(self) -> Result<(), String> {
        let next = self.path.with_extension("next");
        std::fs::write(&next, format!("{:+}", self.seconds)).map_err(|e| e.to_string())?;
        std::fs::rename(&next, &self.path).map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        loop {
            let seen = offset_seen(&self.url);
            if let Ok(seen) = seen {
                if (seen - self.seconds).abs() < 0.005 {
                    return Ok(());
                }
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(format!(
                    "the server's clock did not follow the file: {seen:?} s off, not {}",
                    self.seconds
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The clock of the server at `url` minus this process's, in seconds.
fn offset_seen(url: &str) -> Result<f64, String> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let server = s as f64 + us as f64 / 1e6;
    let here = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    Ok(server - here)
}

impl Drop for ClockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A skewed server, or `None` (skipped with a message) where none can run;
/// under `CI=true` that is a failure.
pub fn skewed_or_skip(test: &str, args: &[&str]) -> Option<SkewedServer> {
    match SkewedServer::start(args) {
        Ok(s) => Some(s),
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: {why}"
            );
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}
