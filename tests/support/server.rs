//! Throwaway `redis-server` processes on free ports, killed on drop.
//!
//! Shared by the integration tests (`tests/support/mod.rs`) and the examples
//! (`#[path]`-included), so it depends on nothing but std.
//!
//! The binary is `redis-server` from the PATH, or `$NOLOCK_REDIS_SERVER`.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One `redis-server` child process. Its log is printed to stderr when it is
/// dropped during a panic (a failing test), and its directory is removed.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// The binary, when not [`redis_server_binary`].
    binary: Option<String>,
    /// Extra environment (e.g. libfaketime's `LD_PRELOAD`).
    env: Vec<(String, String)>,
    /// How long a start may take to answer `PING`.
    ready: Duration,
}

/// The binary to run: `$NOLOCK_REDIS_SERVER` or `redis-server`.
pub fn redis_server_binary() -> String {
    std::env::var("NOLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The message shown when the binary is missing.
pub fn install_hint() -> String {
    format!(
        "could not run `{}`. Install Redis 7 or later (Debian/Ubuntu: `apt-get install redis-server`, \
         macOS: `brew install redis`), or point NOLOCK_REDIS_SERVER at the binary, \
         or set REDIS_URL to use a running server",
        redis_server_binary()
    )
}

/// A port that was free a moment ago, and never handed out before in this
/// process: two tests running at once must not get the same port (the
/// kernel may give a just-released port again), or one server's `PING`
/// would answer for the other's start. Another process may still take it
/// before the server binds; [`RedisServer::start`] then retries on a new
/// port.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free local port");
        if handed_out.insert(port) {
            return port;
        }
    }
    panic!("no local port left that this process has not used")
}

/// The server at `$REDIS_URL` when it is set, else a new one (keep the
/// returned guard alive): for the examples that measure a server.
pub fn url_from_env_or_start() -> (String, Option<RedisServer>) {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    }
}

impl RedisServer {
    /// Start a server on a free port and wait until it answers `PING`.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start a server with extra `redis-server` arguments (e.g. `--maxmemory`).
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_as(None, &[], args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start `binary` (default: [`redis_server_binary`]) with `env` added to
    /// its environment and extra arguments; an error when it never answers.
    pub fn start_as(
        binary: Option<&str>,
        env: &[(String, String)],
        args: &[&str],
    ) -> Result<Self, String> {
        Self::start_tries(binary, env, args, 5, Duration::from_secs(10))
    }

    /// [`Self::start_as`] with `tries` ports, each given `ready` to answer:
    /// a quick probe of whether a binary runs at all.
    pub fn start_tries(
        binary: Option<&str>,
        env: &[(String, String)],
        args: &[&str],
        tries: usize,
        ready: Duration,
    ) -> Result<Self, String> {
        let extra_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut last_error = String::new();
        for _ in 0..tries {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("nolock-redis-{}-{port}", std::process::id()));
            let mut server = RedisServer {
                port,
                child: None,
                dir,
                extra_args: extra_args.clone(),
                binary: binary.map(str::to_owned),
                env: env.to_vec(),
                ready,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(format!(
            "redis-server did not start after {tries} tries: {last_error}"
        ))
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let port = self.port.to_string();
        let log = self.log_path();
        let binary = self.binary.clone().unwrap_or_else(redis_server_binary);
        let child = Command::new(&binary)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", install_hint()));
        self.child = Some(child);
        self.wait_ready(self.ready)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", self.log()));
                }
            }
            // Ours, not another server that holds the port (ours then fails
            // to bind and exits, and the start is tried on another port):
            // our process logged that it listens. (Asked through the log,
            // not a command, so that the tests' command counts stay exact.)
            if ping(self.port) && self.listening() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!("no PING reply within {timeout:?}: {}", self.log()))
    }

    /// True when this server's own process logged that it accepts
    /// connections (its log lines start with its pid).
    fn listening(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let prefix = format!("{pid}:");
        self.log()
            .lines()
            .any(|line| line.starts_with(&prefix) && line.contains("Ready to accept connections"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Kill the server (SIGKILL: no shutdown, nothing saved).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the server again on the same port (after [`Self::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}: {last}", self.port);
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let _ = writeln!(
                std::io::stderr(),
                "---- redis-server :{} log ----\n{}---- end of log ----",
                self.port,
                self.log()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// True when something on `port` answers `PING` with `+PONG`.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}
