//! The registry as one process sees it: the two scripts that write and
//! read it (`lua/config/put.lua`, `lua/config/read.lua`), the parse of a
//! stored field, and the cache every handle of a client reads, refreshed by
//! a poll of the epoch.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::Value;
use serde::{Deserialize, Serialize};

use super::{Config, Family, Mode, Spec, EPOCH_KEY, REGISTRY_KEY};
use crate::client::Connection;
use crate::script::{embedded, Invocation, Script};
use crate::{Error, Result};

pub(super) static PUT: Script = embedded!("config/put");
static READ: Script = embedded!("config/read");

/// What the registry field holds after `<epoch> <ms> `.
#[derive(Serialize, Deserialize)]
pub(super) struct Body {
    pub(super) spec: Spec,
    #[serde(default)]
    pub(super) mode: Mode,
    #[serde(default)]
    pub(super) generation: u64,
}

pub(super) fn field(family: Family, name: &str) -> String {
    format!("{}:{name}", family.as_str())
}

fn foreign(field: &str, reason: impl Into<String>) -> Error {
    Error::ForeignConfig {
        key: REGISTRY_KEY.to_owned(),
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// The registry scripts' refusals of foreign data, as the typed error
/// naming the key (and field) they name.
fn typed(err: Error) -> Error {
    let Error::Redis(redis_err) = &err else {
        return err;
    };
    let text = redis_err.to_string();
    if !text.contains("nolock config/") {
        return err;
    }
    let key = [EPOCH_KEY, REGISTRY_KEY]
        .into_iter()
        .find(|k| text.contains(&format!("key {k} ")));
    let field = text
        .split("field ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("");
    match key {
        Some(key) => Error::ForeignConfig {
            key: key.to_owned(),
            field: field.to_owned(),
            reason: text,
        },
        None => err,
    }
}

/// Reads one registry field's value.
pub(super) fn parse(field_name: &str, value: &[u8]) -> Result<Config> {
    let text = std::str::from_utf8(value).map_err(|_| foreign(field_name, "not UTF-8"))?;
    let (family, name) = field_name
        .split_once(':')
        .ok_or_else(|| foreign(field_name, "the field is not <family>:<name>"))?;
    let family: Family = family
        .parse()
        .map_err(|_| foreign(field_name, "an unknown family"))?;
    let mut parts = text.splitn(3, ' ');
    let (Some(epoch), Some(ms), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(foreign(field_name, "not \"<epoch> <ms> <body>\""));
    };
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| foreign(field_name, format!("{s:?} is not a number")))
    };
    let (epoch, changed_at_ms) = (number(epoch)?, number(ms)?);
    let body: Body = serde_json::from_str(body)
        .map_err(|e| foreign(field_name, format!("the body does not parse: {e}")))?;
    if body.spec.family() != family {
        return Err(foreign(
            field_name,
            format!("holds a {} spec", body.spec.family()),
        ));
    }
    body.spec
        .validate()
        .map_err(|e| foreign(field_name, format!("bad numbers: {e}")))?;
    Ok(Config {
        family,
        name: name.to_owned(),
        spec: body.spec,
        mode: body.mode,
        generation: body.generation,
        epoch,
        changed_at_ms,
    })
}

/// The registry as a process sees it: a cache of every configuration,
/// refreshed when the epoch moved.
pub(crate) struct Registry {
    pub(super) conn: Connection,
    entries: RwLock<HashMap<String, Arc<Config>>>,
    /// The epoch the cache reflects; `u64::MAX` before the first read.
    seen: AtomicU64,
    poll: Duration,
    watching: AtomicBool,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("seen", &self.seen.load(Ordering::Relaxed))
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(conn: Connection, poll: Duration) -> Registry {
        Registry {
            conn,
            entries: RwLock::new(HashMap::new()),
            seen: AtomicU64::new(u64::MAX),
            poll,
            watching: AtomicBool::new(false),
        }
    }

    /// The cached configuration of a field, if any.
    pub(crate) fn cached(&self, field: &str) -> Option<Arc<Config>> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(field)
            .cloned()
    }

    /// Keeps the newer of the cached and `config`.
    pub(super) fn remember(&self, config: Config) -> Arc<Config> {
        let key = field(config.family, &config.name);
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        match entries.get(&key) {
            Some(old) if old.epoch >= config.epoch => Arc::clone(old),
            _ => {
                let config = Arc::new(config);
                entries.insert(key, Arc::clone(&config));
                config
            }
        }
    }

    pub(super) async fn put(
        &self,
        field_name: &str,
        body: &Body,
        when: &str,
    ) -> Result<(bool, Option<Config>)> {
        let body = serde_json::to_string(body).map_err(Error::Encode)?;
        let call = Invocation::new(&PUT, &[REGISTRY_KEY, EPOCH_KEY])
            .arg(field_name)
            .arg(body)
            .arg(when);
        let mut conn = self.conn.clone();
        let reply = call.run(&mut conn).await.map_err(typed)?;
        let unexpected = |detail: &str| Error::UnexpectedReply {
            script: PUT.name(),
            detail: detail.to_owned(),
        };
        let Value::Array(items) = reply else {
            return Err(unexpected("not an array"));
        };
        let written = matches!(items.first(), Some(Value::Int(1)));
        let config = match items.get(1) {
            Some(Value::BulkString(v)) => Some(parse(field_name, v)?),
            Some(Value::Nil) | Some(Value::Boolean(false)) | None => None,
            Some(_) => return Err(unexpected("the value is not a string")),
        };
        Ok((written, config))
    }

    /// The stored configuration of `family`/`name`, created from `spec` when
    /// there is none. Starts the watcher.
    pub(crate) async fn declare(
        self: &Arc<Self>,
        family: Family,
        name: &str,
        spec: &Spec,
    ) -> Result<Arc<Config>> {
        self.watch();
        let f = field(family, name);
        let body = Body {
            spec: spec.clone(),
            mode: Mode::Normal,
            generation: 0,
        };
        let (_, config) = self.put(&f, &body, "create").await?;
        let config = config.ok_or_else(|| Error::UnexpectedReply {
            script: PUT.name(),
            detail: "no value after a create".into(),
        })?;
        Ok(self.remember(config))
    }

    /// Reads the epoch, and the registry when it moved: one read-only
    /// script call.
    pub(crate) async fn refresh(&self) -> Result<()> {
        let seen = self.seen.load(Ordering::Acquire);
        let what = if seen == u64::MAX {
            "all".to_owned()
        } else {
            format!("since:{seen}")
        };
        let (epoch, fields) = self.read(&what).await?;
        if epoch == seen {
            return Ok(());
        }
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for (f, value) in &fields {
            // A foreign field is left out of the cache: the handle of that
            // name declares, and meets the error there.
            if let Ok(config) = parse(f, value) {
                let key = field(config.family, &config.name);
                if entries.get(&key).is_none_or(|old| old.epoch < config.epoch) {
                    entries.insert(key, Arc::new(config));
                }
            }
        }
        self.seen.store(epoch, Ordering::Release);
        Ok(())
    }

    /// The epoch and the fields `what` asks for (see `lua/config/read.lua`).
    pub(super) async fn read(&self, what: &str) -> Result<(u64, Vec<(String, Vec<u8>)>)> {
        let call = Invocation::new(&READ, &[REGISTRY_KEY, EPOCH_KEY]).arg(what);
        let reply = call.run(&mut self.conn.clone()).await.map_err(typed)?;
        let unexpected = |detail: &str| Error::UnexpectedReply {
            script: READ.name(),
            detail: detail.to_owned(),
        };
        let Value::Array(items) = reply else {
            return Err(unexpected("not an array"));
        };
        let mut items = items.into_iter();
        let epoch = match items.next() {
            Some(Value::Int(e)) if e >= 0 => e as u64,
            _ => return Err(unexpected("no epoch")),
        };
        let mut fields = Vec::new();
        while let Some(f) = items.next() {
            match (f, items.next()) {
                (Value::BulkString(f), Some(Value::BulkString(v))) => {
                    let f = String::from_utf8(f)
                        .map_err(|_| foreign("?", "a field that is not UTF-8"))?;
                    fields.push((f, v));
                }
                _ => return Err(unexpected("fields and values do not pair")),
            }
        }
        Ok((epoch, fields))
    }

    /// Every field of the registry, each parsed or the error naming it.
    pub(super) async fn read_all(&self) -> Result<Vec<Result<Config>>> {
        let (_, fields) = self.read("all").await?;
        Ok(fields.iter().map(|(f, v)| parse(f, v)).collect())
    }

    /// Starts the task that polls the epoch, once, when a runtime is there.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watching.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Registry> = Arc::downgrade(self);
        let poll = self.poll;
        runtime.spawn(async move {
            // A fixed period, whatever a read takes (a late tick is not
            // made up in a burst).
            let mut ticks = tokio::time::interval(poll);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                if let Err(err) = registry.refresh().await {
                    crate::observe::config_poll_failed(&err);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_parses_back_and_foreign_values_are_named() {
        let body = Body {
            spec: Spec::counter(100, Duration::from_secs(60)),
            mode: Mode::Blocked,
            generation: 2,
        };
        let text = format!("7 1000 {}", serde_json::to_string(&body).unwrap());
        let config = parse("counter:api", text.as_bytes()).unwrap();
        assert_eq!(config.epoch, 7);
        assert_eq!(config.mode, Mode::Blocked);
        assert_eq!(config.generation, 2);
        assert_eq!(config.spec.to_string(), "counter 100/1min");
        for (field, value) in [
            ("counter:api", "7 1000"),
            ("counter:api", "x 1000 {}"),
            ("counter:api", "7 1000 {\"spec\":1}"),
            ("lock:api", text.as_str()),
            ("nope:api", text.as_str()),
            ("api", text.as_str()),
            (
                "counter:api",
                "7 1000 {\"spec\":{\"kind\":\"counter\",\"limit\":0,\"window_ms\":1}}",
            ),
        ] {
            match parse(field, value.as_bytes()) {
                Err(Error::ForeignConfig { key, field: f, .. }) => {
                    assert_eq!((key.as_str(), f.as_str()), (REGISTRY_KEY, field));
                }
                other => panic!("{field} {value}: {other:?}"),
            }
        }
    }
}
