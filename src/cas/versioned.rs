//! Versioned values: a serde value and a version that rises by one on every
//! write, in one hash (`v`: the value as JSON, `ver`: the version).

use redis::{aio::ConnectionLike, Value};
use serde::{de::DeserializeOwned, Serialize};

use crate::script::{embedded, run_one, Invocation, Operation, Reply, Script};
use crate::{validate, Error, Result};

static GET_VERSIONED: Script = embedded!("cas/get_versioned");
static SET_IF_VERSION: Script = embedded!("cas/set_if_version");

/// The largest version: versions are stored as Redis integers (`i64`).
const MAX_VERSION: u64 = i64::MAX as u64;

/// A value with its version, as read by [`get_versioned`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Versioned<T> {
    /// The stored value.
    pub value: T,
    /// Its version: 1 after the first write, one more after every write.
    /// Pass it to [`set_if_version`] to write only if nothing changed since.
    pub version: u64,
}

/// The outcome of [`set_if_version`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a conflict means nothing was written"]
pub enum Update<T> {
    /// The version was unchanged; the value was written with this new
    /// version (the expected one plus 1).
    Written {
        /// The version of the value just written.
        version: u64,
    },
    /// The version had moved on; nothing was written.
    Conflict {
        /// What is stored now, to retry on without another read: `None` when
        /// the key does not exist (it was deleted, or never written and a
        /// version other than 0 was expected).
        current: Option<Versioned<T>>,
    },
}

impl<T> Update<T> {
    /// True for [`Update::Written`].
    pub fn is_written(&self) -> bool {
        matches!(self, Update::Written { .. })
    }
}

/// Read the versioned value at `key` and its version; `None` when the key
/// does not exist (version 0).
///
/// Runs with `EVALSHA_RO` (read-only script), so a replica can serve it.
///
/// # Errors
///
/// [`Error::EmptyKey`] before any I/O. [`Error::Decode`] when the stored
/// value is not JSON for `T`. [`Error::Redis`] when the key holds another
/// type (`WRONGTYPE`) or a hash that `set_if_version` did not write;
/// [`Error::Indeterminate`] (a read is safe to retry).
///
/// # Example
///
/// ```no_run
/// #[derive(serde::Deserialize)]
/// struct Settings { theme: String }
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// if let Some(s) = nolock::cas::get_versioned::<Settings, _>(conn, "settings:42").await? {
///     println!("theme {} at version {}", s.value.theme, s.version);
/// }
/// # Ok(()) }
/// ```
pub async fn get_versioned<T, C>(conn: &mut C, key: &str) -> Result<Option<Versioned<T>>>
where
    T: DeserializeOwned + Send,
    C: ConnectionLike + Send,
{
    run_one(&GetVersioned::<T>::new(key)?, conn).await
}

/// [`get_versioned`] as a value, for a [`crate::Batch`] (read-only:
/// `EVALSHA_RO`, a replica can serve it).
pub struct GetVersioned<T> {
    call: Invocation,
    value: std::marker::PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> GetVersioned<T> {
    /// Read the versioned value at `key`.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyKey`] before any I/O.
    pub fn new(key: &str) -> Result<Self> {
        validate::key(key)?;
        Ok(GetVersioned {
            call: Invocation::new(&GET_VERSIONED, &[key]),
            value: std::marker::PhantomData,
        })
    }
}

impl<T: DeserializeOwned + Send> Operation for GetVersioned<T> {
    type Output = Option<Versioned<T>>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, value: Value) -> Result<Option<Versioned<T>>> {
        let mut reply = Reply::new(GET_VERSIONED.name(), value)?;
        let version = reply.uint()?;
        let stored = reply.bytes()?;
        reply.finish()?;
        versioned(&GET_VERSIONED, version, stored)
    }
}

impl<T> Clone for GetVersioned<T> {
    fn clone(&self) -> Self {
        GetVersioned {
            call: self.call.clone(),
            value: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for GetVersioned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetVersioned")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

/// Write `value` at `key` only if its version is still `version`; version 0
/// means "only if the key does not exist". One round trip.
///
/// Of any number of writers that pass the same version, exactly one gets
/// [`Update::Written`] with the new version (`version + 1`); the others get
/// [`Update::Conflict`] with the value and version now stored, ready for the
/// next attempt. The value is stored as JSON (`serde_json`). Writes keep an
/// expiry that was set on the key; nolock never sets one.
///
/// `T` is both written and, on a conflict, read back, so it owns its data:
/// pass a `&String` or your struct, not a `&&str`.
///
/// # Errors
///
/// Before any I/O: [`Error::EmptyKey`], [`Error::OutOfRange`] (`version`
/// above `i64::MAX`, which no stored version can be), [`Error::Encode`]
/// (`value` cannot be serialized), [`Error::ValueTooLarge`] (its JSON is
/// above 512 MiB). From Redis: [`Error::Decode`] (conflict with a stored
/// value that is not JSON for `T`; nothing written), [`Error::Overflow`]
/// (the stored version is `i64::MAX`; nothing written), [`Error::Redis`]
/// (`WRONGTYPE`, or a hash not written here) and [`Error::Indeterminate`]
/// (the write may have happened: read it back with [`get_versioned`]).
///
/// # Example
///
/// ```no_run
/// use nolock::cas::{self, Update};
/// # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
/// let regions = vec!["eu".to_owned(), "us".to_owned()];
/// // Version 0: create, only if nobody has.
/// match cas::set_if_version(conn, "config:feature-x", 0, &regions).await? {
///     Update::Written { version } => assert_eq!(version, 1),
///     Update::Conflict { current } => println!("already created: {current:?}"),
/// }
/// # Ok(()) }
/// ```
pub async fn set_if_version<T, C>(
    conn: &mut C,
    key: &str,
    version: u64,
    value: &T,
) -> Result<Update<T>>
where
    T: Serialize + DeserializeOwned,
    C: ConnectionLike + Send,
{
    let call = set_if_version_call(key, version, value)?;
    decode_update(call.run(conn).await?)
}

/// [`set_if_version`] as a value: for a [`crate::Batch`], or to carry an
/// operation id ([`Operation::idempotent`]) so that a resend after a lost
/// reply cannot write a second version. The value is serialized when it is
/// built.
///
/// ```
/// use nolock::{cas::SetIfVersion, Operation};
///
/// let op = SetIfVersion::new("config:feature-x", 3, &vec!["eu", "us"])?.idempotent("deploy-118")?;
/// # let _: nolock::Idempotent<SetIfVersion<Vec<String>>> = op;
/// # Ok::<(), nolock::Error>(())
/// ```
pub struct SetIfVersion<T> {
    call: Invocation,
    value: std::marker::PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> SetIfVersion<T> {
    /// Write `value` at `key` if its version is `version` (0: absent).
    ///
    /// # Errors
    ///
    /// As [`set_if_version`] before any I/O.
    pub fn new<V: Serialize + ?Sized>(key: &str, version: u64, value: &V) -> Result<Self> {
        Ok(SetIfVersion {
            call: set_if_version_call(key, version, value)?,
            value: std::marker::PhantomData,
        })
    }
}

impl<T: DeserializeOwned + Send> Operation for SetIfVersion<T> {
    type Output = Update<T>;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<Update<T>> {
        decode_update(reply)
    }
}

impl<T> Clone for SetIfVersion<T> {
    fn clone(&self) -> Self {
        SetIfVersion {
            call: self.call.clone(),
            value: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for SetIfVersion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetIfVersion")
            .field("call", &self.call)
            .finish_non_exhaustive()
    }
}

pub(super) fn set_if_version_call<T: Serialize + ?Sized>(
    key: &str,
    version: u64,
    value: &T,
) -> Result<Invocation> {
    validate::key(key)?;
    if version > MAX_VERSION {
        return Err(Error::OutOfRange {
            what: "version",
            given: version,
            max: MAX_VERSION,
        });
    }
    let json = serde_json::to_vec(value).map_err(Error::Encode)?;
    let json = validate::value("value", &json)?;
    Ok(Invocation::new(&SET_IF_VERSION, &[key])
        .arg(version)
        .arg(json))
}

/// `{1, version}`, `{0, version, value-or-nil}` or `{-1, version}`.
pub(super) fn decode_update<T: DeserializeOwned>(value: Value) -> Result<Update<T>> {
    let mut reply = Reply::new(SET_IF_VERSION.name(), value)?;
    let status = reply.int()?;
    let version = reply.uint()?;
    let update = match status {
        1 => Update::Written { version },
        0 => Update::Conflict {
            current: versioned(&SET_IF_VERSION, version, reply.bytes()?)?,
        },
        -1 => {
            return Err(Error::Overflow {
                what: "version",
                value: i64::try_from(version).unwrap_or(i64::MAX),
                delta: 1,
            })
        }
        other => {
            return Err(Error::UnexpectedReply {
                script: SET_IF_VERSION.name(),
                detail: format!("unknown status {other}"),
            })
        }
    };
    reply.finish()?;
    Ok(update)
}

/// A stored (version, value) pair: both present, or version 0 and no value.
fn versioned<T: DeserializeOwned>(
    script: &'static Script,
    version: u64,
    stored: Option<Vec<u8>>,
) -> Result<Option<Versioned<T>>> {
    match (version, stored) {
        (0, None) => Ok(None),
        (1.., Some(bytes)) => Ok(Some(Versioned {
            value: serde_json::from_slice(&bytes).map_err(Error::Decode)?,
            version,
        })),
        (version, stored) => Err(Error::UnexpectedReply {
            script: script.name(),
            detail: format!(
                "version {version} with {} value",
                if stored.is_some() { "a" } else { "no" }
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::words;
    use redis::Value::{Array, BulkString, Int, Nil};
    use std::collections::BTreeMap;

    #[test]
    fn the_command_carries_the_version_then_the_json() {
        let call = set_if_version_call("k", 41, &("a", 1)).unwrap();
        assert_eq!(
            words(call.command()),
            [
                "EVALSHA",
                SET_IF_VERSION.sha1(),
                "1",
                "k",
                "41",
                r#"["a",1]"#
            ]
        );
    }

    #[test]
    fn bad_input_is_rejected_before_a_command_is_built() {
        assert!(matches!(
            set_if_version_call("", 0, &1),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            set_if_version_call("k", MAX_VERSION + 1, &1),
            Err(Error::OutOfRange {
                what: "version",
                ..
            })
        ));
        assert!(set_if_version_call("k", MAX_VERSION, &1).is_ok());
        // JSON object keys must be strings.
        let map: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = set_if_version_call("k", 0, &map).unwrap_err();
        assert!(matches!(err, Error::Encode(_)));
        assert!(err.is_invalid_input());
    }

    #[test]
    fn updates_decode_every_reply_shape() {
        let written: Update<u32> = decode_update(Array(vec![
            Int(1),
            BulkString(b"9007199254740993".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            written,
            Update::Written {
                version: 9_007_199_254_740_993
            }
        );
        let conflict: Update<u32> = decode_update(Array(vec![
            Int(0),
            BulkString(b"3".to_vec()),
            BulkString(b"7".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            conflict,
            Update::Conflict {
                current: Some(Versioned {
                    value: 7,
                    version: 3
                })
            }
        );
        let gone: Update<u32> =
            decode_update(Array(vec![Int(0), BulkString(b"0".to_vec()), Nil])).unwrap();
        assert_eq!(gone, Update::Conflict { current: None });
        assert!(matches!(
            decode_update::<u32>(Array(vec![
                Int(-1),
                BulkString(b"9223372036854775807".to_vec())
            ])),
            Err(Error::Overflow {
                what: "version",
                value: i64::MAX,
                delta: 1
            })
        ));
        assert!(matches!(
            decode_update::<u32>(Array(vec![
                Int(0),
                BulkString(b"3".to_vec()),
                BulkString(b"\"text\"".to_vec())
            ])),
            Err(Error::Decode(_))
        ));
        assert!(decode_update::<u32>(Array(vec![Int(0), BulkString(b"3".to_vec()), Nil])).is_err());
        assert!(decode_update::<u32>(Array(vec![Int(2), Int(1)])).is_err());
    }
}
