//! Can this server's fence counters go back? A check to run at startup.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{ErrorKind, Value};

use crate::{Error, Result};

/// What a restart of the server does to fence counters, from its
/// persistence settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restart {
    /// `appendonly yes` with `appendfsync always`: every increment is on disk
    /// before the grant is returned, so a restart keeps every counter.
    Keeps,
    /// `appendonly yes` with `appendfsync everysec`: the last second or two of
    /// increments can be lost when the machine (its kernel, its VM) goes
    /// down between fsyncs, and their fences are then handed out again. A
    /// crash of the server process alone (`kill -9`, the OOM killer) loses
    /// nothing it acknowledged: Redis writes the log to the kernel before it
    /// replies (`cargo run --release --example everysec_loss` measures it).
    LosesLastSecond,
    /// `appendonly yes` with `appendfsync always` or `everysec`, but
    /// `no-appendfsync-on-rewrite yes`: while a background rewrite or
    /// snapshot runs, the log is not fsynced at all, so a crash then loses
    /// what the operating system had not flushed (up to about 30 s on Linux).
    LosesDuringRewrite,
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
    /// `INFO replication`, which do not show `appendfsync`,
    /// `no-appendfsync-on-rewrite`, `save` or the `min-replicas-*` settings.
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
    /// `no-appendfsync-on-rewrite`: true when the log is not fsynced while a
    /// rewrite or snapshot runs; `None` from `INFO`.
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
            Restart::LosesLastSecond => {
                Some("appendfsync everysec: a crash of the machine loses up to about a second of increments")
            }
            Restart::LosesDuringRewrite => Some(
                "no-appendfsync-on-rewrite yes: a crash during a rewrite or snapshot loses \
                 what the OS had not flushed (up to about 30 s of increments)",
            ),
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
/// `no-appendfsync-on-rewrite`, `save`, `min-replicas-to-write` and
/// `min-replicas-max-lag`, then `INFO replication` (for the role and the
/// connected replicas). Every setting that weakens the fsync of an
/// increment is read: `appendfsync` other than `always`, and
/// `no-appendfsync-on-rewrite yes`, which skips the fsync while a rewrite or
/// snapshot runs ([`Restart::LosesDuringRewrite`]). When the server refuses
/// `CONFIG GET` (an ACL user without `+config|get`, or
/// `rename-command CONFIG ""`, common on managed services), it falls back to
/// `INFO persistence`, which tells whether the append-only file is on but
/// not its fsync policy: the report then says [`ConfigSource::Info`] and,
/// with the file on, [`Restart::Unknown`]. Permissions needed: `+info`, and
/// `+config|get` for the full report. Nothing is written.
///
/// The answer is about one server: on a cluster, [`cluster_durability`]
/// reads every primary.
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
    let config = match config_get().query_async::<Value>(conn).await {
        Ok(reply) => Some(reply),
        Err(err) if refused(&err) => None,
        Err(err) => return Err(Error::from_redis(err)),
    };
    let replication = info(conn, "replication").await?;
    let persistence = match config {
        Some(_) => None,
        None => Some(info(conn, "persistence").await?),
    };
    report(config, &replication, persistence.as_ref())
}

/// [`durability()`] for every primary of a cluster: the report of each, by
/// its address (`host:port`), in address order. Fences of a resource are
/// handed out by the primary that owns its slot, so each primary's settings
/// decide for its own resources; a service that relies on fences checks
/// them all.
///
/// Each command goes to every primary of the cluster connection's slot map
/// at once (`CONFIG GET`, then `INFO replication`, and `INFO persistence`
/// where `CONFIG GET` was refused): three round trips at most, whatever the
/// size of the cluster. Replicas are not read: they hand out no fences until
/// they are promoted, and a failover is reported by each primary's
/// [`Durability::failover_can_go_back`].
///
/// # Errors
///
/// As [`durability()`], for the first primary that fails.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut redis::cluster_async::ClusterConnection) -> Result<(), String> {
/// for (primary, report) in nolock::fence::cluster_durability(conn).await.map_err(|e| e.to_string())? {
///     if report.restart != nolock::fence::Restart::Keeps {
///         return Err(format!("{primary}: {}", report.reasons().join("; ")));
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn cluster_durability(conn: &mut ClusterConnection) -> Result<Vec<(String, Durability)>> {
    let config = per_primary(conn, config_get()).await?;
    let replication = per_primary(conn, info_cmd("replication")).await?;
    let refused_config = config.values().any(|reply| match reply {
        Value::ServerError(err) => refused(&err.clone().into()),
        _ => false,
    });
    let persistence = if refused_config {
        Some(per_primary(conn, info_cmd("persistence")).await?)
    } else {
        None
    };
    let mut reports = Vec::with_capacity(config.len());
    for (node, reply) in config {
        let config = match reply {
            Value::ServerError(err) => {
                let err: redis::RedisError = err.into();
                if !refused(&err) {
                    return Err(Error::from_redis(err));
                }
                None
            }
            reply => Some(reply),
        };
        let replication = node_info(&replication, &node)?;
        let persistence = match (&config, &persistence) {
            (None, Some(persistence)) => Some(node_info(persistence, &node)?),
            _ => None,
        };
        reports.push((node, report(config, &replication, persistence.as_ref())?));
    }
    reports.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(reports)
}

/// One `CONFIG GET` of every setting read (Redis 7.0+ takes several).
fn config_get() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(&CONFIG_NAMES[..]);
    cmd
}

fn info_cmd(section: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    cmd
}

/// `cmd` sent to every primary at once: each primary's reply (or its
/// server error) by address.
async fn per_primary(
    conn: &mut ClusterConnection,
    cmd: redis::Cmd,
) -> Result<std::collections::BTreeMap<String, Value>> {
    let reply = conn
        .route_command(
            cmd,
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await
        .map_err(Error::from_redis)?;
    let Value::Map(entries) = reply else {
        return Err(unexpected(
            "a command sent to every primary did not answer per node",
        ));
    };
    entries
        .into_iter()
        .map(|(node, reply)| match node {
            Value::BulkString(node) => Ok((String::from_utf8_lossy(&node).into_owned(), reply)),
            Value::SimpleString(node) => Ok((node, reply)),
            other => Err(unexpected(&format!("a node named {other:?}"))),
        })
        .collect()
}

/// One primary's `INFO` section, parsed.
fn node_info(
    replies: &std::collections::BTreeMap<String, Value>,
    node: &str,
) -> Result<HashMap<String, String>> {
    match replies.get(node) {
        Some(Value::ServerError(err)) => Err(Error::from_redis(err.clone().into())),
        Some(reply) => {
            let text: String = redis::from_redis_value(reply.clone())
                .map_err(|e| unexpected(&format!("INFO from {node}: {e}")))?;
            Ok(parse_info(&text))
        }
        None => Err(unexpected(&format!("no INFO reply from {node}"))),
    }
}

/// The report from the settings (`None`: `CONFIG GET` was refused, and
/// `persistence` is `INFO persistence`) and `INFO replication`.
fn report(
    config: Option<Value>,
    replication: &HashMap<String, String>,
    persistence: Option<&HashMap<String, String>>,
) -> Result<Durability> {
    let role = replication
        .get("role")
        .cloned()
        .ok_or_else(|| unexpected("INFO replication has no role"))?;
    let connected_replicas = match replication.get("connected_slaves") {
        Some(n) => parse(n, "connected_slaves")?,
        None => 0,
    };
    let Some(config) = config else {
        let appendonly = persistence
            .and_then(|p| p.get("aof_enabled"))
            .map(String::as_str)
            == Some("1");
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
    let settings: HashMap<String, String> =
        redis::from_redis_value(config).map_err(|e| unexpected(&format!("CONFIG GET: {e}")))?;
    let get = |name: &str| {
        settings
            .get(name)
            .cloned()
            .ok_or_else(|| unexpected(&format!("CONFIG GET {name} returned nothing")))
    };
    let appendonly = get("appendonly")? == "yes";
    let appendfsync = get("appendfsync")?;
    let no_fsync_on_rewrite = get("no-appendfsync-on-rewrite")? == "yes";
    let save = get("save")?;
    let restart = match (appendonly, appendfsync.as_str()) {
        (true, "always" | "everysec") if no_fsync_on_rewrite => Restart::LosesDuringRewrite,
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
    let text: String = info_cmd(section)
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
            Restart::LosesLastSecond,
            Restart::LosesDuringRewrite,
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
