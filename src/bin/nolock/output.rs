//! What `nolock` prints: tables for people, JSON with `--json`.

use std::collections::BTreeMap;

use nolock::config::Config;
use nolock::redis::IntoConnectionInfo;
use nolock::{BatchConnection, Client};
use serde::Serialize;

use super::{Cli, Failure};

pub(super) fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| Failure {
            code: 1,
            message: format!("cannot encode the output: {e}"),
        })
}

pub(super) fn config_out(cli: &Cli, config: &Config) -> Result<String, Failure> {
    if cli.json {
        json(config)
    } else {
        Ok(table(std::slice::from_ref(config)))
    }
}

pub(super) fn configs_out(cli: &Cli, configs: &[Config]) -> Result<String, Failure> {
    if cli.json {
        json(configs)
    } else if configs.is_empty() {
        Ok("no configurations stored\n".to_owned())
    } else {
        Ok(table(configs))
    }
}

/// A table: FAMILY NAME MODE GEN CHANGED SPEC, columns padded.
fn table(configs: &[Config]) -> String {
    let mut rows = vec![[
        "FAMILY".to_owned(),
        "NAME".to_owned(),
        "MODE".to_owned(),
        "GEN".to_owned(),
        "CHANGED".to_owned(),
        "SPEC".to_owned(),
    ]];
    rows.extend(configs.iter().map(|c| {
        [
            c.family.to_string(),
            c.name.clone(),
            c.mode.to_string(),
            c.generation.to_string(),
            utc(c.changed_at_ms),
            c.spec.to_string(),
        ]
    }));
    render(&rows)
}

fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm), for days since 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// One server's report, as printed.
#[derive(Debug, Serialize)]
struct DurabilityOut {
    node: String,
    role: String,
    connected_replicas: u64,
    appendonly: bool,
    appendfsync: Option<String>,
    no_appendfsync_on_rewrite: Option<bool>,
    save: Option<String>,
    min_replicas_to_write: Option<u64>,
    /// `config` (CONFIG GET answered) or `info` (it was refused).
    source: &'static str,
    /// What a restart does to fence counters.
    restart: String,
    fences_can_go_back: bool,
    reasons: Vec<String>,
}

pub(super) async fn durability(cli: &Cli, client: &Client) -> Result<String, Failure> {
    let mut conn = client.connection();
    let reports = match conn.as_cluster() {
        Some(cluster) => nolock::fence::cluster_durability(cluster).await?,
        None => {
            // host:port, not the URL, which may carry a password.
            let node = cli
                .url
                .first()
                .and_then(|url| url.as_str().into_connection_info().ok())
                .map(|info| info.addr().to_string())
                .unwrap_or_default();
            vec![(node, nolock::fence::durability(&mut conn).await?)]
        }
    };
    let out: Vec<DurabilityOut> = reports
        .into_iter()
        .map(|(node, d)| DurabilityOut {
            node,
            source: match d.source {
                nolock::fence::ConfigSource::Config => "config",
                _ => "info",
            },
            restart: format!("{:?}", d.restart),
            fences_can_go_back: d.fences_can_go_back(),
            reasons: d.reasons(),
            role: d.role,
            connected_replicas: d.connected_replicas,
            appendonly: d.appendonly,
            appendfsync: d.appendfsync,
            no_appendfsync_on_rewrite: d.no_appendfsync_on_rewrite,
            save: d.save,
            min_replicas_to_write: d.min_replicas_to_write,
        })
        .collect();
    if cli.json {
        return json(&out);
    }
    let unknown = || "?".to_owned();
    let mut rows = vec![[
        "NODE".to_owned(),
        "ROLE".to_owned(),
        "REPLICAS".to_owned(),
        "APPENDONLY".to_owned(),
        "APPENDFSYNC".to_owned(),
        "RESTART".to_owned(),
    ]];
    let mut reasons = BTreeMap::new();
    for r in &out {
        rows.push([
            r.node.clone(),
            r.role.clone(),
            r.connected_replicas.to_string(),
            if r.appendonly { "yes" } else { "no" }.to_owned(),
            r.appendfsync.clone().unwrap_or_else(unknown),
            r.restart.clone(),
        ]);
        reasons.insert(r.node.clone(), r.reasons.clone());
    }
    let mut text = render(&rows);
    for (node, why) in reasons {
        for reason in why {
            text.push_str(&format!("{node}: {reason}\n"));
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_459_999_999), "2026-12-05T08:39:59Z");
    }
}
