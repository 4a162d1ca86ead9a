//! PostgreSQL for the fenced-write tests (`tests/fence_postgres.rs`,
//! `tests/permit_postgres.rs`): at `$DATABASE_URL` (default: 127.0.0.1:5432,
//! database `test`, user `postgres`, trust auth; `.ci/test` starts it), each
//! test in a schema of its own, dropped afterwards.
#![allow(dead_code)]

use std::future::Future;

use tokio_postgres::{Client, NoTls};

const DEFAULT_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=5";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A connection, its `search_path` set to `schema` when given.
pub async fn connect(schema: Option<&str>) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection closed: {e}");
        }
    });
    if let Some(schema) = schema {
        client
            .batch_execute(&format!("SET search_path TO {schema}"))
            .await?;
    }
    Ok(client)
}

/// Run `test` in a fresh schema made by `setup` (SQL in which `{schema}`
/// stands for the schema's name), and drop the schema afterwards, also when
/// the test fails. Skips with a message when PostgreSQL is unreachable;
/// fails instead under `CI=true`.
pub async fn with_schema<F, Fut>(name: &str, setup: &str, test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let admin = match connect(None).await {
        Ok(client) => client,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "PostgreSQL at {:?} is unreachable in CI: {e}",
                database_url()
            )
        }
        Err(e) => {
            eprintln!(
                "SKIPPED {name}: PostgreSQL at {:?} is unreachable ({e}). \
                 Start it (bash .ci/test does) or set DATABASE_URL.",
                database_url()
            );
            return;
        }
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let schema = format!("nolock_{name}_{}_{nanos}", std::process::id());
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; {}",
            setup.replace("{schema}", &schema)
        ))
        .await
        .expect("create the test schema");
    // Run in a task so a failing assertion still reaches the cleanup below.
    let outcome = tokio::spawn(test(schema.clone())).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the test schema");
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
