//! What every handle shares: its numbers come from the registry of stored
//! configurations ([`crate::config`]), declared on its first call, and the
//! handle rebuilds what decides (a limiter, a counter, a semaphore, a lock)
//! once per change it learns of. A call reads the cached numbers: no round
//! trip but the first.

use std::fmt;
use std::sync::{Arc, RwLock};

use super::Name;
use crate::config::{Config, Family, Mode, Registry, Spec};
use crate::{observe, Error, Result};

/// Builds what decides from a stored configuration and the handle's name with its
/// generation; answers it and the name its keys use.
type Make<E> = dyn Fn(&Config, Name) -> Result<(E, Name)> + Send + Sync;

/// What decides for one version of a stored configuration.
pub(crate) struct Current<E> {
    pub(crate) engine: E,
    /// The name every key is built from (algorithm and generation
    /// included).
    pub(crate) name: Name,
    pub(crate) config: Arc<Config>,
}

impl<E> Current<E> {
    pub(crate) fn mode(&self) -> Mode {
        self.config.mode
    }
}

pub(crate) struct Managed<E> {
    registry: Arc<Registry>,
    family: Family,
    /// `<family>:<name>`, the registry field.
    field: Arc<str>,
    name: Name,
    own: Spec,
    make: Arc<Make<E>>,
    built: Arc<RwLock<Option<Arc<Current<E>>>>>,
    /// One declaration at a time per handle (and its clones): 64 tasks
    /// making their first call at once send one, not 64.
    declaring: Arc<tokio::sync::Mutex<()>>,
}

impl<E> Clone for Managed<E> {
    fn clone(&self) -> Self {
        Managed {
            registry: Arc::clone(&self.registry),
            family: self.family,
            field: Arc::clone(&self.field),
            name: self.name.clone(),
            own: self.own.clone(),
            make: Arc::clone(&self.make),
            built: Arc::clone(&self.built),
            declaring: Arc::clone(&self.declaring),
        }
    }
}

impl<E> fmt::Debug for Managed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Managed")
            .field("family", &self.family)
            .field("name", &self.name)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl<E> Managed<E> {
    /// `own` must be numbers the handle was built from (checked).
    pub(crate) fn new(
        registry: Arc<Registry>,
        name: Name,
        own: Spec,
        make: impl Fn(&Config, Name) -> Result<(E, Name)> + Send + Sync + 'static,
    ) -> Managed<E> {
        let family = own.family();
        Managed {
            registry,
            family,
            field: Arc::from(format!("{family}:{}", name.as_str())),
            name,
            own,
            make: Arc::new(make),
            built: Arc::new(RwLock::new(None)),
            declaring: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// What decides now: the stored numbers as this process last learned
    /// them (declaring them on the first call).
    pub(crate) async fn current(&self) -> Result<Arc<Current<E>>> {
        let config = match self.registry.cached(&self.field) {
            Some(config) => config,
            None => {
                let _one = self.declaring.lock().await;
                match self.registry.cached(&self.field) {
                    Some(config) => config,
                    None => {
                        self.registry
                            .declare(self.family, self.name.as_str(), &self.own)
                            .await?
                    }
                }
            }
        };
        if let Some(current) = self.latest() {
            if current.config.epoch == config.epoch {
                return Ok(current);
            }
        }
        let (engine, name) = (self.make)(&config, self.name.generation(config.generation))?;
        if config.spec != self.own {
            observe::config_differs(
                self.family.as_str(),
                self.name.as_str(),
                &config.spec.to_string(),
                &self.own.to_string(),
            );
        }
        let current = Arc::new(Current {
            engine,
            name,
            config,
        });
        let mut built = self.built.write().unwrap_or_else(|e| e.into_inner());
        match &*built {
            // A concurrent call built a newer one: keep it.
            Some(other) if other.config.epoch > current.config.epoch => Ok(Arc::clone(other)),
            _ => {
                *built = Some(Arc::clone(&current));
                Ok(current)
            }
        }
    }

    /// What decided the latest call, if any call was made.
    pub(crate) fn latest(&self) -> Option<Arc<Current<E>>> {
        self.built.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Declares the handle's numbers now, and refuses other stored ones.
    pub(crate) async fn insist(&self) -> Result<Config> {
        let config = self
            .registry
            .declare(self.family, self.name.as_str(), &self.own)
            .await?;
        if config.spec != self.own {
            return Err(Error::ConfigMismatch {
                family: self.family.as_str(),
                name: self.name.as_str().to_owned(),
                stored: config.spec.to_string(),
                ours: self.own.to_string(),
            });
        }
        self.current().await?;
        Ok((*config).clone())
    }

    /// The stored configuration this handle decides by.
    pub(crate) async fn config(&self) -> Result<Config> {
        Ok((*self.current().await?.config).clone())
    }

    pub(crate) fn blocked(&self) -> Error {
        Error::Blocked {
            family: self.family.as_str(),
            name: self.name.as_str().to_owned(),
        }
    }

    pub(crate) fn count_unlimited(&self) {
        observe::unlimited(self.family.as_str(), self.name.as_str());
    }
}
