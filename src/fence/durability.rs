//! Can this server's fence counters go back? A check to run at startup.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::ErrorKind;

use crate::{Error, Result};

/// What a restart of the server does to fence counters, from its
/// persistence settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restart {
    /// `appendonly yes` with `appendfsync always`: every increment is on disk
    /// before the grant is returned, so a restart keeps every counter.
    Keeps,
    /// `appendonly yes` with `appendfsync always`, but
    /// `no-appendfsync-on-rewrite yes`: while the server rewrites its
    /// append-only file or saves a snapshot (in the background, as often as
    /// `auto-aof-rewrite-*` and `save` say), it skips the fsync, and a crash
    /// then can lose up to about 30 s of increments (redis.conf's words).
    LosesDuringRewrite,
    /// `appendonly yes` with `appendfsync everysec`: the last second or two of
    /// increments can be lost (a crash between fsyncs), and their fences are
    /// then handed out again.
    LosesLastSecond,
    /// `appendonly yes` with `appendfsync no`: the operating system decides
    /// when the log reaches the disk (typically within 30 s); that much can
    /// be lost.
    LosesUnflushed,
    /// No append-only file: everything since the last RDB snapshot is lost
    /// (with no `save` rule, or when the snapshot fails, every counter starts
    /// again from zero).
    LosesSinceSnapshot,
    /// No append-only file and no snapshots (`save ""`): every counter starts
    /// again from zero.
    LosesAll,
    /// The append-only file is on but its fsync policy could not be read
    /// (`CONFIG GET` was refused, and `INFO` does not tell it). Treat as
    /// [`Restart::LosesLastSecond`] at best.
    Unknown,
}

/// Where a [`Durability`] report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigSource {
    /// `CONFIG GET` and `INFO replication`: the full picture.
    Config,
    /// `CONFIG GET` was refused (no `+config|get` permission, or the command
    /// is renamed or disabled): only `INFO persistence` and
    /// `INFO replication`, which do not show `appendfsync`, `save` or the
    /// `min-replicas-*` settings.
    Info,
}

/// The persistence and replication settings of one Redis server, and
/// whether its fence counters can go back. Returned by [`durability`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "refuse to start when fences can go back, or say why it is acceptable"]
// Non-exhaustive: a report that grows with each setting it learns to read.
#[non_exhaustive]
pub struct Durability {
    /// Where the settings were read.
    pub source: ConfigSource,
    /// What a restart does to the counters.
    pub restart: Restart,
    /// `appendonly` (or `aof_enabled` from `INFO`).
    pub appendonly: bool,
    /// `appendfsync` (`always`, `everysec` or `no`); `None` from `INFO`.
    pub appendfsync: Option<String>,
    /// `no-appendfsync-on-rewrite`; `None` from `INFO`.
    pub no_appendfsync_on_rewrite: Option<bool>,
    /// The RDB `save` rules (`""` for none); `None` from `INFO`.
    pub save: Option<String>,
    /// `role` from `INFO replication` (`master` or `slave`).
    pub role: String,
    /// Replicas connected to this primary (`connected_slaves`).
    pub connected_replicas: u64,
    /// `min-replicas-to-write`; `None` from `INFO`.
    pub min_replicas_to_write: Option<u64>,
    /// `min-replicas-max-lag` in seconds; `None` from `INFO`.
    pub min_replicas_max_lag: Option<u64>,
}

impl Durability {
    /// True when a failover can hand out fences again: this server is a
    /// replica, or a primary with replicas. Replication is asynchronous, so a
    /// promoted replica may not have seen the last grants, whatever
    /// `min-replicas-to-write` says (that setting only bounds the lag; `WAIT`
    /// after each grant narrows it further). Only a primary without replicas
    /// is free of this.
    pub fn failover_can_go_back(&self) -> bool {
        self.role != "master" || self.connected_replicas > 0
    }

    /// True unless a restart keeps every counter ([`Restart::Keeps`]) and no
    /// failover can happen ([`Durability::failover_can_go_back`]). A service
    /// whose safety rests on Redis fences can refuse to start when this is
    /// true; one that accepts the failover risk (see the module docs) checks
    /// `restart == Restart::Keeps` alone.
    pub fn fences_can_go_back(&self) -> bool {
        self.restart != Restart::Keeps || self.failover_can_go_back()
    }

    /// Why fences can go back, one sentence per cause (empty when they cannot).
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        let restart = match self.restart {
            Restart::Keeps => None,
            Restart::LosesDuringRewrite => Some(
                "no-appendfsync-on-rewrite yes: a crash during a rewrite or snapshot loses up to about 30 s of increments",
            ),
            Restart::LosesLastSecond => {
                Some("appendfsync everysec: a crash loses up to about a second of increments")
            }
            Restart::LosesUnflushed => {
                Some("appendfsync no: a crash loses what the OS had not flushed")
            }
            Restart::LosesSinceSnapshot => {
                Some("appendonly no: a restart loses every increment since the last snapshot")
            }
            Restart::LosesAll => {
                Some("no persistence: a restart starts every fence counter again from zero")
            }
            Restart::Unknown => {
                Some("appendfsync unknown (CONFIG GET refused): assume a crash loses increments")
            }
        };
        out.extend(restart.map(str::to_owned));
        if self.role != "master" {
            out.push(format!(
                "role {}: grants must be taken on the primary",
                self.role
            ));
        } else if self.connected_replicas > 0 {
            out.push(format!(
                "{} replica(s), asynchronous: a failover can promote one that missed the last grants",
                self.connected_replicas
            ));
        }
        out
    }
}

/// Read the persistence and replication settings of the server behind
/// `conn`, and say whether fence counters can go back (see "Limits of a
/// Redis fence" in the module docs).
///
/// Sends `CONFIG GET` for `appendonly`, `appendfsync`,
/// `no-appendfsync-on-rewrite` (which turns `always` into "not during a
/// rewrite"), `save`,
/// `min-replicas-to-write` and `min-replicas-max-lag`, then
/// `INFO replication` (for the role and the connected replicas). When the
/// server refuses `CONFIG GET` (an ACL user without `+config|get`, or
/// `rename-command CONFIG ""`, common on managed services), it falls back to
/// `INFO persistence`, which tells whether the append-only file is on but
/// not its fsync policy: the report then says [`ConfigSource::Info`] and, with the
/// file on, [`Restart::Unknown`]. Permissions needed: `+info`, and
/// `+config|get` for the full report. Nothing is written.
///
/// The answer is about one server: on a cluster, connect to each primary
/// (e.g. with a `redis::Client` per node) and check each.
///
/// # Errors
///
/// [`Error::Redis`] when `INFO` is refused too; [`Error::Indeterminate`] on
/// a lost connection (safe to retry: this only reads); and
/// [`Error::UnexpectedReply`] for settings that cannot be parsed.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> Result<(), String> {
/// let report = nolock::fence::durability(conn).await.map_err(|e| e.to_string())?;
/// if report.fences_can_go_back() {
///     return Err(format!("refusing to start: {}", report.reasons().join("; ")));
/// }
/// # Ok(()) }
/// ```
pub async fn durability<C>(conn: &mut C) -> Result<Durability>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    for name in CONFIG_NAMES {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let config: Option<Vec<HashMap<String, String>>> = match pipe.query_async(conn).await {
        Ok(replies) => Some(replies),
        Err(err) if refused(&err) => None,
        Err(err) => return Err(Error::from_redis(err)),
    };
    let replication = info(conn, "replication").await?;
    let role = replication
        .get("role")
        .cloned()
        .ok_or_else(|| unexpected("INFO replication has no role"))?;
    let connected_replicas = match replication.get("connected_slaves") {
        Some(n) => parse(n, "connected_slaves")?,
        None => 0,
    };
    let Some(config) = config else {
        let persistence = info(conn, "persistence").await?;
        let appendonly = persistence.get("aof_enabled").map(String::as_str) == Some("1");
        return Ok(Durability {
            source: ConfigSource::Info,
            restart: if appendonly {
                Restart::Unknown
            } else {
                Restart::LosesSinceSnapshot
            },
            appendonly,
            appendfsync: None,
            no_appendfsync_on_rewrite: None,
            save: None,
            role,
            connected_replicas,
            min_replicas_to_write: None,
            min_replicas_max_lag: None,
        });
    };
    let settings: HashMap<String, String> = config.into_iter().flatten().collect();
    let get = |name: &str| {
        settings
            .get(name)
            .cloned()
            .ok_or_else(|| unexpected(&format!("CONFIG GET {name} returned nothing")))
    };
    let appendonly = get("appendonly")? == "yes";
    let appendfsync = get("appendfsync")?;
    let save = get("save")?;
    let no_fsync_on_rewrite = get("no-appendfsync-on-rewrite")? == "yes";
    let restart = match (appendonly, appendfsync.as_str()) {
        (true, "always") if no_fsync_on_rewrite => Restart::LosesDuringRewrite,
        (true, "always") => Restart::Keeps,
        (true, "everysec") => Restart::LosesLastSecond,
        (true, _) => Restart::LosesUnflushed,
        (false, _) if save.trim().is_empty() => Restart::LosesAll,
        (false, _) => Restart::LosesSinceSnapshot,
    };
    Ok(Durability {
        source: ConfigSource::Config,
        restart,
        appendonly,
        appendfsync: Some(appendfsync),
        no_appendfsync_on_rewrite: Some(no_fsync_on_rewrite),
        save: Some(save),
        role,
        connected_replicas,
        min_replicas_to_write: Some(parse(
            &get("min-replicas-to-write")?,
            "min-replicas-to-write",
        )?),
        min_replicas_max_lag: Some(parse(
            &get("min-replicas-max-lag")?,
            "min-replicas-max-lag",
        )?),
    })
}

const CONFIG_NAMES: [&str; 6] = [
    "appendonly",
    "appendfsync",
    "no-appendfsync-on-rewrite",
    "save",
    "min-replicas-to-write",
    "min-replicas-max-lag",
];

/// A reply in which the server refused the command (ACL, unknown command),
/// as opposed to a lost connection.
fn refused(err: &redis::RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

async fn info<C>(conn: &mut C, section: &str) -> Result<HashMap<String, String>>
where
    C: ConnectionLike + Send,
{
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .map_err(Error::from_redis)?;
    Ok(parse_info(&text))
}

/// `field:value` lines; `#` headers and blank lines skipped.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn parse(value: &str, what: &str) -> Result<u64> {
    value
        .parse()
        .map_err(|_| unexpected(&format!("{what} is not a count: {value:?}")))
}

fn unexpected(detail: &str) -> Error {
    Error::UnexpectedReply {
        script: "fence::durability",
        detail: detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(restart: Restart, role: &str, replicas: u64) -> Durability {
        Durability {
            source: ConfigSource::Config,
            restart,
            appendonly: true,
            appendfsync: Some("always".into()),
            no_appendfsync_on_rewrite: Some(false),
            save: Some(String::new()),
            role: role.into(),
            connected_replicas: replicas,
            min_replicas_to_write: Some(0),
            min_replicas_max_lag: Some(10),
        }
    }

    #[test]
    fn only_always_fsync_without_replicas_keeps_fences() {
        assert!(!report(Restart::Keeps, "master", 0).fences_can_go_back());
        assert!(report(Restart::Keeps, "master", 0).reasons().is_empty());
        for restart in [
            Restart::LosesDuringRewrite,
            Restart::LosesLastSecond,
            Restart::LosesUnflushed,
            Restart::LosesSinceSnapshot,
            Restart::LosesAll,
            Restart::Unknown,
        ] {
            let r = report(restart, "master", 0);
            assert!(
                r.fences_can_go_back() && r.reasons().len() == 1,
                "{restart:?}"
            );
        }
        assert!(report(Restart::Keeps, "master", 1).fences_can_go_back());
        assert!(report(Restart::Keeps, "slave", 0).fences_can_go_back());
    }

    #[test]
    fn info_lines_parse() {
        let info = parse_info("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\r\n");
        assert_eq!(info["role"], "master");
        assert_eq!(info["connected_slaves"], "2");
    }
}
