use redis::Value;

use crate::{Error, Result};

/// Reads a script's flat array reply field by field, turning every surprise
/// into [`Error::UnexpectedReply`] naming the script.
#[derive(Debug)]
pub(crate) struct Reply {
    script: &'static str,
    items: std::vec::IntoIter<Value>,
    index: usize,
}

impl Reply {
    pub(crate) fn new(script: &'static str, value: Value) -> Result<Self> {
        match value {
            Value::Array(items) => Ok(Reply {
                script,
                items: items.into_iter(),
                index: 0,
            }),
            other => Err(unexpected(
                script,
                format!("expected an array, got {other:?}"),
            )),
        }
    }

    fn next(&mut self) -> Result<Value> {
        self.index += 1;
        self.items
            .next()
            .ok_or_else(|| unexpected(self.script, format!("reply has no field {}", self.index)))
    }

    fn bad(&self, want: &str, got: &Value) -> Error {
        unexpected(
            self.script,
            format!("field {}: expected {want}, got {got:?}", self.index),
        )
    }

    /// An integer field (a Lua number), or an integer sent as a string.
    pub(crate) fn int(&mut self) -> Result<i64> {
        match self.next()? {
            Value::Int(n) => Ok(n),
            ref v @ Value::BulkString(ref bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.bad("an integer", v)),
            other => Err(self.bad("an integer", &other)),
        }
    }

    /// A non-negative integer field. Values above 2^53 must be sent as strings
    /// by the script, since Lua numbers are doubles.
    pub(crate) fn uint(&mut self) -> Result<u64> {
        match self.next()? {
            Value::Int(n) if n >= 0 => Ok(n as u64),
            ref v @ Value::BulkString(ref bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.bad("a non-negative integer", v)),
            other => Err(self.bad("a non-negative integer", &other)),
        }
    }

    /// A 0/1 flag (Lua `true` arrives as 1, `false` as nil).
    pub(crate) fn flag(&mut self) -> Result<bool> {
        match self.next()? {
            Value::Int(0) | Value::Nil => Ok(false),
            Value::Int(1) => Ok(true),
            other => Err(self.bad("0 or 1", &other)),
        }
    }

    /// A status code in `0..count`.
    pub(crate) fn code(&mut self, count: i64) -> Result<i64> {
        match self.next()? {
            Value::Int(n) if (0..count).contains(&n) => Ok(n),
            other => Err(self.bad(&format!("a status in 0..{count}"), &other)),
        }
    }

    /// A byte-string field, or `None` for nil / Lua `false`.
    pub(crate) fn bytes(&mut self) -> Result<Option<Vec<u8>>> {
        match self.next()? {
            Value::BulkString(bytes) => Ok(Some(bytes)),
            Value::SimpleString(s) => Ok(Some(s.into_bytes())),
            Value::Nil | Value::Int(0) => Ok(None),
            other => Err(self.bad("a string or nil", &other)),
        }
    }

    /// Check that every field was read: a longer reply means a script and its
    /// wrapper disagree.
    pub(crate) fn finish(mut self) -> Result<()> {
        match self.items.next() {
            None => Ok(()),
            Some(extra) => Err(unexpected(
                self.script,
                format!("unexpected extra field {extra:?}"),
            )),
        }
    }
}

fn unexpected(script: &'static str, detail: String) -> Error {
    Error::UnexpectedReply { script, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_in_order() {
        let value = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"9007199254740993".to_vec()),
            Value::Int(-2),
            Value::Nil,
        ]);
        let mut reply = Reply::new("t", value).unwrap();
        assert!(reply.flag().unwrap());
        assert_eq!(reply.uint().unwrap(), 9_007_199_254_740_993);
        assert_eq!(reply.int().unwrap(), -2);
        assert_eq!(reply.bytes().unwrap(), None);
        reply.finish().unwrap();
    }

    #[test]
    fn short_long_and_mistyped_replies_are_errors() {
        let mut short = Reply::new("t", Value::Array(vec![])).unwrap();
        assert!(matches!(short.int(), Err(Error::UnexpectedReply { .. })));
        let long = Reply::new("t", Value::Array(vec![Value::Int(1)])).unwrap();
        assert!(long.finish().is_err());
        let mut negative = Reply::new("t", Value::Array(vec![Value::Int(-1)])).unwrap();
        assert!(negative.uint().is_err());
        assert!(Reply::new("t", Value::Int(1)).is_err());
    }
}
