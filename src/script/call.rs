//! Typed calls of your own scripts: [`Call`].
//!
//! A `Call` wraps the same [`Invocation`] as nolock's own operations, so
//! [`Call::run`] is [`run_one`] and a `Call` in a [`crate::Batch`] is any
//! other entry: everything the engine does for nolock's scripts (see the
//! [module docs](super)) it does for yours.

use std::any::type_name;
use std::fmt;
use std::marker::PhantomData;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, ToRedisArgs, Value};

use super::{run_one, Invocation, Operation, Script};
use crate::{Error, Result};

/// One call of one of your scripts, with its reply decoded into `T`
/// (any redis-rs `FromRedisValue`: `i64`, `String`, `Vec<_>`, tuples,
/// `redis::Value`, ...).
///
/// Built by [`ScriptDir::call`](super::ScriptDir::call) (or [`Call::new`] from a [`Script`]); run
/// alone with [`Call::run`], or many at once in a [`crate::Batch`] (it is an
/// [`Operation`]).
///
/// # Errors and what they promise
///
/// As for nolock's own operations, with one caveat. [`Error::Redis`] is
/// definite for nolock's scripts because each checks everything before its
/// first write; Redis does not roll back a script that fails halfway, so a
/// script of yours that raises an error (or calls `redis.error_reply`)
/// after a write leaves that write in place. Follow the same rule (checks
/// first, then writes; `lib/fail` and `lib/args` help) and the promise
/// holds for yours too. A reply that does not decode into `T` is
/// [`Error::ReplyType`]: the script ran, so it is not definite.
#[must_use = "a Call does nothing until it is run or pushed into a Batch"]
pub struct Call<T> {
    call: Invocation,
    output: PhantomData<fn() -> T>,
}

impl<T> Call<T> {
    /// A call of `script` with these keys (every key the script touches
    /// must be one of them; on a cluster they must share a slot).
    pub fn new(script: &'static Script, keys: &[&str]) -> Self {
        Call {
            call: Invocation::new(script, keys),
            output: PhantomData,
        }
    }

    /// Add an argument (`ARGV[n]`, in order).
    #[must_use = "arg returns the call with the argument added"]
    pub fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.call = self.call.arg(arg);
        self
    }

    /// The script this call runs.
    pub fn script(&self) -> &'static Script {
        self.call.script()
    }
}

impl<T: FromRedisValue + Send> Call<T> {
    /// Run the script: one round trip (`EVALSHA`, or `EVALSHA_RO` for a
    /// read-only script), two when the server has lost it (a pipelined
    /// `SCRIPT LOAD` + `EVALSHA`, or `EVAL` where `SCRIPT LOAD` is refused).
    ///
    /// # Errors
    ///
    /// [`Error::CrossSlot`] when the keys span cluster slots (nothing is
    /// sent); [`Error::Redis`] when the server refused the call or the
    /// script raised an error (see the type docs for what that promises);
    /// [`Error::Indeterminate`] when the reply was lost;
    /// [`Error::ReplyType`] when the reply does not decode into `T` (the
    /// script ran).
    pub async fn run<C>(&self, conn: &mut C) -> Result<T>
    where
        C: ConnectionLike + Send,
    {
        run_one(self, conn).await
    }
}

impl<T: FromRedisValue + Send> Operation for Call<T> {
    type Output = T;

    fn invocation(&self) -> &Invocation {
        &self.call
    }

    fn decode(&self, reply: Value) -> Result<T> {
        T::from_redis_value(reply).map_err(|err| Error::ReplyType {
            script: self.script().name(),
            target: type_name::<T>(),
            detail: err.to_string(),
        })
    }
}

impl<T> Clone for Call<T> {
    fn clone(&self) -> Self {
        Call {
            call: self.call.clone(),
            output: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("script", &self.script().name())
            .field("output", &type_name::<T>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::ScriptDir;

    static FIXTURES: ScriptDir = crate::scripts!("$CARGO_MANIFEST_DIR/tests/fixtures/lua");

    #[test]
    fn a_call_builds_the_engine_command_and_decodes_into_the_type_asked() {
        let call = FIXTURES
            .call::<(i64, String)>("counter/add", &["{t}:c"])
            .unwrap()
            .arg(5);
        let words = super::super::words(call.invocation().command());
        assert_eq!(words[0], "EVALSHA");
        assert_eq!(words[2..], ["1", "{t}:c", "5"]);
        let ok = call.decode(Value::Array(vec![
            Value::Int(5),
            Value::BulkString(b"x".to_vec()),
        ]));
        assert_eq!(ok.unwrap(), (5, "x".to_owned()));
        let err = call.decode(Value::Int(5)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::ReplyType {
                    script: "counter/add",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_definite());
        let read = FIXTURES.call::<i64>("counter/read", &["k"]).unwrap();
        assert_eq!(
            super::super::words(read.invocation().command())[0],
            "EVALSHA_RO"
        );
    }

    /// A connection that answers script calls from a list of replies
    /// (`SCRIPT LOAD` with the SHA1 it was given), alone or pipelined, and
    /// records the name of each command it was asked to send.
    struct Scripted {
        replies: Vec<redis::RedisResult<Value>>,
        sent: Vec<String>,
    }

    impl Scripted {
        fn new(replies: Vec<redis::RedisResult<Value>>) -> Self {
            Scripted {
                replies,
                sent: vec![],
            }
        }

        fn answer(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
            let words = super::super::words(cmd);
            self.sent.push(words[0].clone());
            if words[0] == "SCRIPT" {
                Ok(Value::BulkString(
                    FIXTURES.get("counter/add").unwrap().sha1().into(),
                ))
            } else {
                self.replies.remove(0)
            }
        }
    }

    impl ConnectionLike for Scripted {
        fn req_packed_command<'a>(
            &'a mut self,
            cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            let reply = self.answer(cmd);
            Box::pin(async move { reply })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipe: &'a redis::Pipeline,
            offset: usize,
            count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            let replies: Vec<Value> = pipe
                .cmd_iter()
                .map(|cmd| match self.answer(cmd) {
                    Ok(value) => value,
                    Err(err) => Value::ServerError(
                        redis::ServerError::try_from(err).expect("a server error"),
                    ),
                })
                .skip(offset)
                .take(count)
                .collect();
            Box::pin(async move { Ok(replies) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn server(kind: redis::ServerErrorKind) -> redis::RedisResult<Value> {
        Err(redis::RedisError::from((
            redis::ErrorKind::Server(kind),
            "x",
        )))
    }

    /// The fallback after one `NOSCRIPT`: a pipelined `SCRIPT LOAD` +
    /// `EVALSHA` (or `EVAL` where `SCRIPT LOAD` is refused); either way one
    /// more round trip in which the script runs once.
    fn is_one_fallback(sent: &[String], evalsha: &str, eval: &str) -> bool {
        sent == [evalsha, eval] || sent == [evalsha, "SCRIPT", evalsha]
    }

    /// What the engine promises nolock's calls, a user call gets: one
    /// fallback after `NOSCRIPT`, a resend after `MOVED`/`READONLY`, nothing
    /// sent twice after a lost reply.
    #[tokio::test]
    async fn a_call_has_the_engine_fallback_resends_and_error_classes() {
        use redis::ServerErrorKind::{Moved, NoScript, ReadOnly};
        let add = || FIXTURES.call::<i64>("counter/add", &["k"]).unwrap().arg(1);

        let mut conn = Scripted::new(vec![server(NoScript), Ok(Value::Int(1))]);
        assert_eq!(add().run(&mut conn).await.unwrap(), 1);
        assert!(
            is_one_fallback(&conn.sent, "EVALSHA", "EVAL"),
            "{:?}",
            conn.sent
        );

        let mut conn = Scripted::new(vec![server(Moved), server(ReadOnly), Ok(Value::Int(2))]);
        let redirects = crate::stats().redirects;
        assert_eq!(add().run(&mut conn).await.unwrap(), 2);
        assert_eq!(conn.sent, ["EVALSHA"; 3]);
        assert!(crate::stats().redirects >= redirects + 2);

        let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let mut conn = Scripted::new(vec![Err(lost)]);
        let err = add().run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Indeterminate(_)) && !err.is_definite());
        assert_eq!(conn.sent, ["EVALSHA"], "never replayed");

        let mut conn = Scripted::new(vec![server(redis::ServerErrorKind::ResponseError)]);
        let err = add().run(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Redis(_)) && err.is_definite());

        let read = FIXTURES.call::<i64>("counter/read", &["k"]).unwrap();
        let mut conn = Scripted::new(vec![server(NoScript), Ok(Value::Int(3))]);
        assert_eq!(read.run(&mut conn).await.unwrap(), 3);
        assert!(
            is_one_fallback(&conn.sent, "EVALSHA_RO", "EVAL_RO"),
            "{:?}",
            conn.sent
        );
    }
}
