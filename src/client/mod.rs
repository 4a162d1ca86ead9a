//! One handle for the whole crate: a [`Client`] owns the connection (one that
//! reconnects, or a cluster connection built with the settings nolock needs),
//! has loaded the scripts, and is cheap to clone. Named handles for the
//! primitives are built from it, and they take **ids**, not Redis keys: a
//! handle derives the key from its name and the caller's id, so two ids never
//! share a key and the keys of one decision always share a cluster slot.
//!
//! ```no_run
//! # async fn run() -> nolock::Result<()> {
//! let client = nolock::Client::connect("redis://127.0.0.1/").await?;
//! // Every clone shares the one connection.
//! let again = client.clone();
//! # let _ = again;
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! The GCRA rate limit named `api` keeps the state of the id `alice` under
//! `{nolock:gcra:api:alice}` (the kind of handle is part of the key: a
//! counter named `api` uses `{nolock:counter:api:alice}`) (and keys derived from it with [`crate::keys::derive`],
//! in the same slot). An id may hold any text: `%` and `}` are written as
//! `%25` and `%7D`, so the id ends the hash tag exactly where the handle says
//! and two different ids never give the same key. A Redis user that nolock's
//! handles run as needs the key pattern `~{nolock:*` (see [`crate::acl`]).
//! A limit that was reset ([`crate::config::Change::Reset`]) has its
//! generation in its keys: `{nolock:gcra:api~1:alice}`.
//!
//! # Numbers
//!
//! A handle's numbers (quota, size, TTL) are a declaration: its first call
//! stores them under its name unless numbers are stored already, and every
//! handle of that name, in every process, decides by the stored ones; an
//! operator changes or switches them at run time ([`crate::config`],
//! [`Client::configs`], the `nolock` command line).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

mod answer;
#[cfg(feature = "axum")]
mod axum;
mod counter;
mod lock;
mod managed;
pub(crate) mod rate;
pub(crate) mod rate_limits;
mod semaphore;

pub use answer::{Admitted, Limited, Rejection};
pub use counter::Counter;
pub use lock::Lock;
#[cfg(feature = "tower")]
pub(crate) use rate::switched;
pub use rate::RateLimit;
#[cfg(feature = "tower")]
pub(crate) use rate_limits::switched_multi;
pub use rate_limits::{RateLimits, RateLimitsBuilder, Scope};
pub use semaphore::Semaphore;

use crate::config::{Configs, Registry, DEFAULT_POLL};
use crate::script::BatchConnection;
use crate::{Error, Result, Scripts};

/// The longest id a handle takes, in bytes (before escaping).
pub const MAX_ID_LEN: usize = 512;

/// The longest handle name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// The connection a [`Client`] owns: a reconnecting single-server
/// connection, a cluster connection, or one the application made. Cheap to
/// clone; it is a [`ConnectionLike`], so the operation-level API
/// ([`crate::rate::Limiter::check`], operation values, [`crate::Batch`])
/// takes it too.
#[derive(Clone)]
pub struct Connection(Inner);

#[derive(Clone)]
enum Inner {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Inner::Manager(_) => "ConnectionManager",
            Inner::Multiplexed(_) => "MultiplexedConnection",
            Inner::Cluster(_) => "ClusterConnection",
        };
        f.debug_tuple("Connection").field(&kind).finish()
    }
}

impl From<ConnectionManager> for Connection {
    fn from(conn: ConnectionManager) -> Self {
        Connection(Inner::Manager(conn))
    }
}

impl From<MultiplexedConnection> for Connection {
    fn from(conn: MultiplexedConnection) -> Self {
        Connection(Inner::Multiplexed(conn))
    }
}

impl From<ClusterConnection> for Connection {
    fn from(conn: ClusterConnection) -> Self {
        Connection(Inner::Cluster(conn))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Manager(c) => c.req_packed_command(cmd),
            Inner::Multiplexed(c) => c.req_packed_command(cmd),
            Inner::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Manager(c) => c.req_packed_commands(pipe, offset, count),
            Inner::Multiplexed(c) => c.req_packed_commands(pipe, offset, count),
            Inner::Cluster(c) => c.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Manager(c) => c.get_db(),
            Inner::Multiplexed(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}

impl BatchConnection for Connection {
    fn as_cluster(&mut self) -> Option<&mut ClusterConnection> {
        match &mut self.0 {
            Inner::Cluster(c) => Some(c),
            _ => None,
        }
    }
}

/// The handle every named primitive is built from. See the [module
/// docs](self).
#[derive(Clone, Debug)]
pub struct Client {
    conn: Connection,
    registry: Arc<Registry>,
}

impl Client {
    /// Connect to one Redis server (`redis://host:port/db`, `rediss://` for
    /// TLS when redis-rs is built with it) through a `ConnectionManager`,
    /// which reconnects after Redis comes back, and load every script.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the URL is malformed or the server does not
    /// answer; the errors of [`Scripts::load`].
    pub async fn connect<T: IntoConnectionInfo>(url: T) -> Result<Client> {
        let client = redis::Client::open(url).map_err(Error::from_redis)?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(Error::from_redis)?;
        Client::from_connection(conn).await
    }

    /// Connect to a Redis Cluster through any of its `nodes`, with the
    /// settings nolock needs (`retries(0)`: a script whose reply was lost is
    /// never replayed; see the crate docs), and load every script on every
    /// node.
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn connect_cluster<I, T>(nodes: I) -> Result<Client>
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        let client = ClusterClient::builder(nodes)
            .retries(0)
            .build()
            .map_err(Error::from_redis)?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(Error::from_redis)?;
        Client::from_connection(conn).await
    }

    /// A client on a connection the application made (a
    /// `MultiplexedConnection`, a `ConnectionManager` with its own settings,
    /// a cluster connection: build that one with `retries(0)`). Loads every
    /// script.
    ///
    /// # Errors
    ///
    /// The errors of [`Scripts::load`].
    pub async fn from_connection(conn: impl Into<Connection>) -> Result<Client> {
        let mut conn = conn.into();
        Scripts::load(&mut conn).await?;
        let registry = Arc::new(Registry::new(conn.clone(), DEFAULT_POLL));
        Ok(Client { conn, registry })
    }

    /// The same client, reading the registry's epoch every `every` instead
    /// of every 250 ms ([`crate::config::DEFAULT_POLL`]): the bound on how
    /// long a process decides by numbers that were changed. Call it before
    /// making handles: handles made before keep the client's registry.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroDuration`] for zero.
    pub fn config_poll(self, every: Duration) -> Result<Client> {
        if every.is_zero() {
            return Err(Error::ZeroDuration {
                what: "config poll",
            });
        }
        let registry = Arc::new(Registry::new(self.conn.clone(), every));
        Ok(Client { registry, ..self })
    }

    /// The registry of named configurations: list, read and change the
    /// numbers every handle of every process decides by
    /// ([`crate::config`]).
    pub fn configs(&self) -> Configs {
        Configs {
            registry: Arc::clone(&self.registry),
        }
    }

    pub(crate) fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// The connection, for the operation-level API (operation values,
    /// batches, a [`crate::rate::Limiter`] with keys of your own).
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }
}

/// A handle's name: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits,
/// `_`, `-` and `.`, starting with a letter or a digit. Names are part of
/// every key a handle writes, so they are checked when the handle is built.
///
/// A name belongs to a **kind** of handle (`counter`, `lock`, `semaphore`,
/// one per rate-limit algorithm), and the kind is part of the key: a counter
/// and a lock named alike, or a GCRA limit and a fixed window named alike,
/// never read each other's state (each would misread the other's).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Name {
    kind: &'static str,
    name: Arc<str>,
    /// How many times the stored configuration was reset; in the keys when
    /// above 0 (`{nolock:<kind>:<name>~<generation>:<id>}`).
    generation: u64,
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl Name {
    /// `name` for a handle of `kind` (lowercase ASCII letters and `-`, one
    /// per handle type: it is written into every key).
    pub(crate) fn new(kind: &'static str, name: &str) -> Result<Name> {
        check_name(name)?;
        debug_assert!(
            !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
            "{kind:?}"
        );
        Ok(Name {
            kind,
            name: Arc::from(name),
            generation: 0,
        })
    }

    /// The same name, in generation `generation` of its configuration.
    pub(crate) fn generation(&self, generation: u64) -> Name {
        Name {
            generation,
            ..self.clone()
        }
    }
}

/// Checks a handle's name: 1 to [`MAX_NAME_LEN`] ASCII letters, digits,
/// `_`, `-` and `.`, starting with a letter or a digit.
pub(crate) fn check_name(name: &str) -> Result<()> {
    {
        let invalid = |reason: String| Error::InvalidArgument {
            what: "name",
            reason,
        };
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(invalid(format!(
                "a handle's name has 1 to {MAX_NAME_LEN} bytes, got {}",
                name.len()
            )));
        }
        let first_ok = name.as_bytes()[0].is_ascii_alphanumeric();
        let all_ok = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !first_ok || !all_ok {
            return Err(invalid(format!(
                "{name:?}: a handle's name is ASCII letters, digits, '_', '-' and '.', \
                 starting with a letter or a digit"
            )));
        }
        Ok(())
    }
}

impl Name {
    /// The same name for another kind of handle (a rate limit whose
    /// algorithm changed).
    pub(crate) fn with_kind(&self, kind: &'static str) -> Name {
        Name {
            kind,
            ..self.clone()
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }

    /// The key of `id` for this name: `{nolock:<kind>:<name>:<id>}`, the id
    /// escaped (`%` → `%25`, `}` → `%7D`) so that it cannot end the hash tag
    /// early. Neither the kind nor the name holds a `:`, so the three parts
    /// are read back unambiguously: two different (kind, name, id) never
    /// share a key.
    pub(crate) fn key(&self, id: &str) -> Result<String> {
        let id = checked_id("id", id)?;
        let mut key = String::with_capacity(12 + self.kind.len() + self.name.len() + id.len());
        key.push_str("{nolock:");
        key.push_str(self.kind);
        key.push(':');
        key.push_str(&self.name);
        if self.generation > 0 {
            key.push('~');
            key.push_str(&self.generation.to_string());
        }
        key.push(':');
        push_escaped(&mut key, id);
        key.push('}');
        Ok(key)
    }

    /// True when `key` is the key of some id of this name ([`Name::key`]).
    pub(crate) fn owns(&self, key: &str) -> bool {
        key.strip_prefix("{nolock:")
            .and_then(|rest| rest.strip_prefix(self.kind))
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.strip_prefix(&*self.name))
            .and_then(|rest| match self.generation {
                0 => Some(rest),
                g => rest.strip_prefix('~')?.strip_prefix(g.to_string().as_str()),
            })
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.strip_suffix('}'))
            .is_some_and(|id| !id.is_empty() && !id.contains('}'))
    }

    /// The key of `member` inside `scope`:
    /// `{nolock:<kind>:<name>:<scope>}:<member>`, both escaped, in the
    /// scope's slot.
    pub(crate) fn member_key(&self, scope: &str, member: &str) -> Result<String> {
        let member = checked_id("member id", member)?;
        let mut key = self.key(scope)?;
        key.push(':');
        push_escaped(&mut key, member);
        Ok(key)
    }
}

/// Checks an id without building a key: a handle's first call checks its
/// input before it reads the registry.
pub(crate) fn check_id(id: &str) -> Result<()> {
    checked_id("id", id).map(|_| ())
}

fn checked_id<'a>(what: &'static str, id: &'a str) -> Result<&'a str> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(Error::InvalidArgument {
            what,
            reason: format!("an id has 1 to {MAX_ID_LEN} bytes, got {}", id.len()),
        });
    }
    Ok(id)
}

fn push_escaped(out: &mut String, id: &str) {
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{hash_tag, slot};

    #[test]
    fn names_are_checked() {
        assert!(Name::new("gcra", "api").is_ok());
        assert!(Name::new("gcra", "api.v2_user-limit").is_ok());
        for bad in ["", "-api", "a:b", "a{b", "a}b", "a b", "é", &"x".repeat(65)] {
            assert!(
                matches!(
                    Name::new("gcra", bad),
                    Err(Error::InvalidArgument { what: "name", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ids_are_escaped_and_keep_the_slot() {
        let name = Name::new("gcra", "api").unwrap();
        assert_eq!(name.key("alice").unwrap(), "{nolock:gcra:api:alice}");
        assert_eq!(name.key("a}b").unwrap(), "{nolock:gcra:api:a%7Db}");
        assert_eq!(name.key("a%7Db").unwrap(), "{nolock:gcra:api:a%257Db}");
        let scoped = name.member_key("acme", "u}1").unwrap();
        assert_eq!(scoped, "{nolock:gcra:api:acme}:u%7D1");
        assert_eq!(slot(&scoped), slot(&name.key("acme").unwrap()));
        assert!(name.owns(&name.key("a}b").unwrap()));
        assert!(!name.owns(&name.with_kind("lock").key("a").unwrap()));
        assert!(!name.owns(&Name::new("gcra", "apix").unwrap().key("a").unwrap()));
        assert!(!name.owns(&scoped));
        assert!(name.key("").is_err());
        assert!(name.key(&"x".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn different_ids_never_share_a_key() {
        let name = Name::new("gcra", "n").unwrap();
        let alphabet = ["a", "}", "{", "%", "7", "D", ":", "2", "5"];
        let mut ids = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = ids
                .iter()
                .flat_map(|id| alphabet.iter().map(move |c| format!("{id}{c}")))
                .collect();
            ids.extend(longer);
        }
        ids.sort();
        ids.dedup();
        ids.retain(|id| !id.is_empty());
        let mut keys = std::collections::HashMap::new();
        for id in &ids {
            let key = name.key(id).unwrap();
            // The whole key is its own hash tag: the id never ends it early.
            assert_eq!(hash_tag(&key).len() + 2, key.len(), "{key}");
            assert!(keys.insert(key.clone(), id.clone()).is_none(), "{key}");
        }
        // Scopes and members: (scope, member) pairs never collide either.
        let mut scoped = std::collections::HashSet::new();
        for scope in ids.iter().take(200) {
            for member in ids.iter().take(200) {
                assert!(scoped.insert(name.member_key(scope, member).unwrap()));
            }
        }
    }
}
