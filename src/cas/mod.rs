//! Conditional writes: compare-and-set, versioned values, monotonic integers,
//! guarded arithmetic and insert-if-absent.
//!
//! Many "we need a lock" problems are one conditional write: *take 7 from the
//! balance if it holds at least 7*, *store this result unless a result is
//! already stored*, *save my edit unless someone saved since I read*. Under a
//! lock that is acquire, read, decide, write, release: four or more round
//! trips, every caller of the key queued behind the holder, and a lease that
//! can run out halfway. Each operation here is instead one Lua script that
//! reads, decides and writes in one atomic step on the server, in one round
//! trip. Nothing is held, so nothing can be left held by a crashed caller.
//!
//! They are the Redis counterparts of the SQL statements that make locks
//! unnecessary in a database:
//!
//! | in SQL | here | script |
//! |---|---|---|
//! | `UPDATE acct SET bal = bal - $1 WHERE id = $2 AND bal >= $1` | [`debit`] | `lua/cas/adjust.lua` |
//! | `UPDATE acct SET bal = bal + $1 WHERE id = $2 AND bal + $1 <= $cap` | [`credit`] | same |
//! | the same with any signed change and both bounds | [`adjust`] | same |
//! | `INSERT ... ON CONFLICT DO NOTHING`, then read what is there | [`set_if_absent`] | `lua/cas/compare_and_set.lua` |
//! | `UPDATE t SET v = $new WHERE k = $1 AND v = $old` | [`compare_and_set`] | `lua/cas/compare_and_set.lua` |
//! | `DELETE FROM t WHERE k = $1 AND v = $old` | [`compare_and_delete`] | `lua/cas/compare_and_delete.lua` |
//! | `UPDATE t SET expires_at = now() + $ttl WHERE k = $1 AND v = $old` | [`compare_and_expire`] | `lua/cas/compare_and_expire.lua` |
//! | `SELECT body, ver FROM doc WHERE id = $1` | [`get_versioned`] | `lua/cas/get_versioned.lua` |
//! | `UPDATE doc SET body = $b, ver = ver + 1 WHERE id = $1 AND ver = $v` | [`set_if_version`] | `lua/cas/set_if_version.lua` |
//! | `UPDATE t SET hw = $x WHERE k = $1 AND hw < $x` | [`set_if_greater`] | `lua/cas/watermark.lua` |
//! | `UPDATE t SET lw = $x WHERE k = $1 AND lw > $x` | [`set_if_less`] | `lua/cas/watermark.lua` |
//!
//! A condition that does not hold is a normal outcome, never an error: every
//! call returns an enum saying what happened, with the current state so the
//! caller can decide (or retry) without another read. Errors are bad input
//! (raised before anything is sent), [`Error::Overflow`], [`Error::Decode`]
//! and Redis failures (see [`Error`]).
//!
//! **Every call is also a value** that checks its input when built:
//! [`CompareAndSet`], [`SetIfAbsent`], [`CompareAndDelete`],
//! [`CompareAndExpire`], [`SetIfGreater`], [`SetIfLess`], [`GetVersioned`],
//! [`SetIfVersion`] and [`Adjust`] ([`debit`], [`credit`] and [`adjust`]):
//! put many in a [`crate::Batch`] to send them in one round trip per server,
//! or give one an operation id ([`crate::Operation::idempotent`]) so that a
//! write resent after a lost reply is applied once and answered with its
//! first reply. The calls take no configuration (each names its key and its
//! condition), so there is no object to build first: the functions are
//! thin forms of these values.
//!
//! # Which one, instead of which lock
//!
//! These replace a lock when the invariant lives in one Redis key. When it
//! lives in another system (a database row, a file, a payment provider), that
//! system has to enforce it: use its own conditional write, or a fencing token
//! it checks (`nolock::fence`).
//!
//! ## A balance that must not go negative: [`debit`] / [`credit`] / [`adjust`]
//!
//! Credits, quotas, stock, seats: the lock version is "lock, GET, check,
//! DECRBY, unlock". [`debit`] checks and subtracts in one step; concurrent
//! debits can never overdraw, and a refused debit writes nothing. Amounts are
//! whole numbers (use cents, milli-units, ...); balances are `i64`, and a
//! result outside `i64` is [`Error::Overflow`], never a wrapped number. A
//! missing key is a balance of 0: a debit from it is refused without creating
//! it, a credit creates it (with no expiry; the key's expiry is otherwise kept).
//!
//! ```no_run
//! use nolock::cas::{self, Adjustment};
//! # async fn charge(conn: &mut redis::aio::MultiplexedConnection, user: u64, cents: u64)
//! #     -> nolock::Result<()> {
//! match cas::debit(conn, &format!("credits:{user}"), cents).await? {
//!     Adjustment::Applied { balance } => println!("charged; {balance} left"),
//!     refused => println!("402 Payment Required: {} left", refused.balance()),
//! }
//! # Ok(()) }
//! ```
//!
//! ## Do the work once per request: [`set_if_absent`] (idempotency keys)
//!
//! A client retries a `POST /payments` whose answer it never got. The lock
//! version is "lock the idempotency key, check, work, store, unlock". Instead:
//! the first request claims the key with a "pending" marker, does the work,
//! and replaces the marker with the stored response ([`compare_and_set`]
//! from the marker, so a claim that expired and was taken over is not
//! overwritten). A retry finds the response and returns it without doing the
//! work again; a retry during the work finds the marker and is told to come
//! back later.
//!
//! Redis alone cannot make the work itself exactly-once: a process that dies
//! between doing the work and storing the response leaves a claim that
//! expires, and a later retry does the work again. Where that matters, hand
//! the same idempotency key to the system doing the work (payment APIs take
//! one).
//!
//! ```no_run
//! use std::time::Duration;
//! use nolock::cas::{self, Expected, Insert};
//! # async fn handler(conn: &mut redis::aio::MultiplexedConnection, key: &str,
//! #     pay: impl FnOnce() -> String) -> nolock::Result<String> {
//! let key = format!("idem:{key}");
//! let day = Duration::from_secs(24 * 3600);
//! match cas::set_if_absent(conn, &key, "pending", Some(Duration::from_secs(30))).await? {
//!     Insert::Inserted => {
//!         let response = pay(); // the work, done once
//!         // Keep the response for a day, in place of our own claim only.
//!         let kept = cas::compare_and_set(conn, &key, Expected::value("pending"), &response, Some(day))
//!             .await?;
//!         if !kept.is_applied() {
//!             // The claim expired during the work and a retry took over:
//!             // size the claim's TTL above the work's worst case.
//!         }
//!         Ok(response)
//!     }
//!     Insert::Existing(stored) if stored == b"pending" => Ok("409: still in progress".into()),
//!     Insert::Existing(stored) => Ok(String::from_utf8_lossy(&stored).into_owned()),
//! }
//! # }
//! ```
//!
//! ## A state machine: [`compare_and_set`]
//!
//! "Only one worker may move job 7 from `queued` to `running`": the
//! transition succeeds for exactly one caller; the others see the state it
//! moved to. [`Expected::Absent`] makes "create only if new" a transition too.
//!
//! ```no_run
//! use nolock::cas::{self, Expected, Outcome};
//! # async fn run(conn: &mut redis::aio::MultiplexedConnection) -> nolock::Result<()> {
//! match cas::compare_and_set(conn, "job:7:state", Expected::value("queued"), "running", None).await? {
//!     Outcome::Applied => println!("job 7 is mine"),
//!     Outcome::Mismatch { current } => println!("job 7 is already {current:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! ## Release and extend what you own: [`compare_and_delete`] / [`compare_and_expire`]
//!
//! A key holding a random token is a lease; `DEL` and `PEXPIRE` alone can
//! release or extend a lease that already expired and passed to someone else.
//! Both operations act only while the key still holds *your* token, and tell
//! you when it does not. (For leases guarding work outside Redis, use
//! `nolock::fence`, which adds a fencing token.)
//!
//! ```no_run
//! use std::time::Duration;
//! use nolock::cas::{self, Outcome};
//! # async fn run(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> nolock::Result<()> {
//! if let Outcome::Mismatch { .. } =
//!     cas::compare_and_expire(conn, "report:lease", token, Duration::from_secs(30)).await?
//! {
//!     println!("lease lost: stop working");
//! }
//! let _released = cas::compare_and_delete(conn, "report:lease", token).await?;
//! # Ok(()) }
//! ```
//!
//! ## Read, modify, write a document: [`get_versioned`] / [`set_if_version`]
//!
//! Optimistic concurrency: read the value and its version, change it in the
//! application, write it back only if the version did not move. A conflict
//! returns the newer value and version, so the retry needs no extra read. No
//! one waits, and a crashed writer blocks no one.
//!
//! ```no_run
//! use nolock::cas::{self, Update};
//! #[derive(serde::Serialize, serde::Deserialize, Default)]
//! struct Cart { items: Vec<String> }
//!
//! # async fn add(conn: &mut redis::aio::MultiplexedConnection, item: &str) -> nolock::Result<u64> {
//! let mut seen = cas::get_versioned::<Cart, _>(conn, "cart:42").await?;
//! loop {
//!     let (version, mut cart) = seen.map_or((0, Cart::default()), |v| (v.version, v.value));
//!     cart.items.push(item.to_owned());
//!     match cas::set_if_version(conn, "cart:42", version, &cart).await? {
//!         Update::Written { version } => return Ok(version),
//!         Update::Conflict { current } => seen = current, // retry on the newer cart
//!     }
//! }
//! # }
//! ```
//!
//! Layout: one hash per value, field `v` holding the value as JSON and field
//! `ver` its version as a decimal integer. A missing key is version 0; the
//! first write makes version 1 and every write adds exactly 1. Versions are
//! exchanged as decimal strings, so they stay exact past 2^53. Writes keep an
//! expiry that someone set on the key; nolock never sets one.
//!
//! ## A value that only moves one way: [`set_if_greater`] / [`set_if_less`]
//!
//! High-water marks ("last processed offset", "newest timestamp seen"), low
//! bids, earliest deadlines: out-of-order writers can never move the value
//! backwards, and nobody has to read first.
//!
//! ```no_run
//! # async fn run(conn: &mut redis::aio::MultiplexedConnection, offset: i64) -> nolock::Result<()> {
//! let mark = nolock::cas::set_if_greater(conn, "consumer:7:offset", offset).await?;
//! if !mark.applied {
//!     println!("stale: {} was already processed past {offset}", mark.value);
//! }
//! # Ok(()) }
//! ```
//!
//! # Limits
//!
//! Values are bytes up to [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) (512 MiB,
//! the largest string Redis stores); integers are `i64`, compared and added
//! exactly inside the scripts (Lua's own numbers are doubles). Every
//! operation touches one key, so each works unchanged on Redis Cluster. As
//! with any Redis write, a reply lost to a timeout ([`Error::Indeterminate`])
//! leaves the outcome unknown, and an acknowledged write can be lost in a
//! failover (replication is asynchronous).
//!
//! [`Error`]: crate::Error
//! [`Error::Overflow`]: crate::Error::Overflow
//! [`Error::Decode`]: crate::Error::Decode
//! [`Error::Indeterminate`]: crate::Error::Indeterminate

mod balance;
mod compare;
mod monotonic;
mod versioned;

pub use balance::{adjust, credit, debit, Adjust, Adjustment};
pub use compare::{
    compare_and_delete, compare_and_expire, compare_and_set, set_if_absent, CompareAndDelete,
    CompareAndExpire, CompareAndSet, Expected, Insert, Outcome, SetIfAbsent,
};
pub use monotonic::{set_if_greater, set_if_less, SetIfGreater, SetIfLess, Watermark};
pub use versioned::{get_versioned, set_if_version, GetVersioned, SetIfVersion, Update, Versioned};

#[cfg(test)]
mod tests {
    use crate::script::Scripts;

    #[test]
    fn every_cas_script_is_embedded() {
        let names: Vec<_> = Scripts::all()
            .iter()
            .map(|s| s.name())
            .filter(|n| n.starts_with("cas/") && !n.ends_with("@once"))
            .collect();
        assert_eq!(
            names,
            [
                "cas/adjust",
                "cas/compare_and_delete",
                "cas/compare_and_expire",
                "cas/compare_and_set",
                "cas/get_versioned",
                "cas/set_if_version",
                "cas/watermark",
            ]
        );
        let read_only: Vec<_> = Scripts::all()
            .iter()
            .filter(|s| s.name().starts_with("cas/") && s.is_read_only())
            .map(|s| s.name())
            .collect();
        assert_eq!(read_only, ["cas/get_versioned"]);
    }
}
