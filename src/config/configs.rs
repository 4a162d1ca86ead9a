//! [`Configs`]: list, read and change the stored configurations.

use std::sync::Arc;

use super::registry::{field, parse, Body, Registry, PUT};
use super::{Change, Config, Family, Mode, Spec};
use crate::{Error, Result};

/// The registry of named configurations, from [`Client::configs`]: list,
/// read and change them. Cheap to clone.
///
/// [`Client::configs`]: crate::Client::configs
#[derive(Clone, Debug)]
pub struct Configs {
    pub(crate) registry: Arc<Registry>,
}

impl Configs {
    /// Every named configuration, sorted by family and name, read from the
    /// server now.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignConfig`] naming the key and field when the registry
    /// holds something nolock did not write; [`Error::Redis`] and
    /// [`Error::Indeterminate`] from Redis.
    pub async fn list(&self) -> Result<Vec<Config>> {
        let mut all = self
            .registry
            .read_all()
            .await?
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| (a.family, &a.name).cmp(&(b.family, &b.name)));
        Ok(all)
    }

    /// The stored configuration of `family`/`name`, read from the server
    /// now; `None` when no process declared it yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name, before any I/O;
    /// [`Error::ForeignConfig`]; errors from Redis.
    pub async fn get(&self, family: Family, name: &str) -> Result<Option<Config>> {
        crate::client::check_name(name)?;
        let f = field(family, name);
        let (_, fields) = self.registry.read(&format!("field:{f}")).await?;
        fields.first().map(|(_, v)| parse(&f, v)).transpose()
    }

    /// Stores `spec` for `spec.family()`/`name` if nothing is stored, and
    /// answers what is stored (this process's numbers or another's).
    ///
    /// # Errors
    ///
    /// As [`Configs::set`].
    pub async fn declare(&self, name: &str, spec: Spec) -> Result<Config> {
        crate::client::check_name(name)?;
        spec.validate()?;
        let config = self.registry.declare(spec.family(), name, &spec).await?;
        Ok((*config).clone())
    }

    /// Stores new numbers for `spec.family()`/`name` (creating it when
    /// missing), keeping or resetting every id's state. Every process
    /// decides by them within one poll interval (see the module docs). The
    /// switch ([`Mode`]) is kept.
    ///
    /// # Errors
    ///
    /// Before anything is written: [`Error::InvalidArgument`] for a bad
    /// name, for [`Change::Reset`] on a semaphore or a lock; the errors of
    /// [`Spec::validate`]. [`Error::ForeignConfig`] when the stored value is
    /// not nolock's; errors from Redis.
    pub async fn set(&self, name: &str, spec: Spec, change: Change) -> Result<Config> {
        crate::client::check_name(name)?;
        spec.validate()?;
        let family = spec.family();
        if change == Change::Reset && !family.can_reset() {
            return Err(Error::InvalidArgument {
                what: "change",
                reason: format!("a {family} cannot be reset: its holders would keep running"),
            });
        }
        self.update(family, name, |old| {
            let generation = match (old, change) {
                (Some(old), Change::Reset) => old.generation + 1,
                (Some(old), Change::Keep) => old.generation,
                (None, _) => 0,
            };
            Ok(Body {
                spec: spec.clone(),
                mode: old.map_or(Mode::Normal, |o| o.mode),
                generation,
            })
        })
        .await
    }

    /// Refuses everything for `family`/`name` (see [`Mode::Blocked`]).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownConfig`] when nothing is stored under the name;
    /// otherwise as [`Configs::set`].
    pub async fn block(&self, family: Family, name: &str) -> Result<Config> {
        self.switch(family, name, Mode::Blocked).await
    }

    /// Admits everything for `family`/`name` (see [`Mode::Unlimited`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lock; otherwise as
    /// [`Configs::block`].
    pub async fn unlimit(&self, family: Family, name: &str) -> Result<Config> {
        if !family.can_unlimit() {
            return Err(Error::InvalidArgument {
                what: "family",
                reason: "a lock cannot be made unlimited".into(),
            });
        }
        self.switch(family, name, Mode::Unlimited).await
    }

    /// Decides `family`/`name` by its numbers again.
    ///
    /// # Errors
    ///
    /// As [`Configs::block`].
    pub async fn unblock(&self, family: Family, name: &str) -> Result<Config> {
        self.switch(family, name, Mode::Normal).await
    }

    /// Reads the registry now into this client's cache (the poll does it on
    /// its own every interval).
    ///
    /// # Errors
    ///
    /// Errors from Redis.
    pub async fn refresh(&self) -> Result<()> {
        self.registry.refresh().await
    }

    async fn switch(&self, family: Family, name: &str, mode: Mode) -> Result<Config> {
        crate::client::check_name(name)?;
        self.update(family, name, |old| match old {
            None => Err(Error::UnknownConfig {
                family: family.as_str(),
                name: name.to_owned(),
            }),
            Some(old) => Ok(Body {
                spec: old.spec.clone(),
                mode,
                generation: old.generation,
            }),
        })
        .await
    }

    /// Read, change, write when nobody wrote in between; again otherwise.
    async fn update(
        &self,
        family: Family,
        name: &str,
        change: impl Fn(Option<&Config>) -> Result<Body>,
    ) -> Result<Config> {
        let f = field(family, name);
        for _ in 0..16 {
            let old = self.get(family, name).await?;
            let body = change(old.as_ref())?;
            let when = old.as_ref().map_or(0, |o| o.epoch).to_string();
            let (written, config) = self.registry.put(&f, &body, &when).await?;
            if written {
                let config = config.ok_or_else(|| Error::UnexpectedReply {
                    script: PUT.name(),
                    detail: "no value after a write".into(),
                })?;
                self.registry.remember(config.clone());
                return Ok(config);
            }
        }
        Err(Error::Contended {
            what: "configuration",
        })
    }
}
