//! The table a person reads, the JSON rows a program reads, and the targets.

use std::fmt::Write as _;

use super::hot_key::HotRun;
use super::ops::Variant;
use super::overhead::CpuCost;
use super::run::{Measured, Row};
use super::Result;

/// The rows as a JSON object: `{"rows": [..], "hot_key": [..]}` (the
/// hot-key runs of `compare`, empty where none ran).
pub fn json<'a>(rows: impl IntoIterator<Item = &'a Row>, hot: &[HotRun]) -> Result<String> {
    let rows: Vec<&Row> = rows.into_iter().collect();
    let hot: Vec<serde_json::Value> = hot
        .iter()
        .map(|run| {
            serde_json::json!({
                "limiter": run.label,
                "decisions": run.decisions,
                "admitted": run.admitted,
                "redis_calls": run.redis_calls,
                "seconds": run.seconds,
                "bound": run.bound,
                "decisions_per_second": run.per_second(),
                "over_admitted": run.over_admitted(),
                "calls_per_decision": run.calls_per_decision(),
            })
        })
        .collect();
    Ok(serde_json::to_string_pretty(
        &serde_json::json!({ "rows": rows, "hot_key": hot }),
    )?)
}

/// Throughput relative to the `lock` row of the same operation and tasks.
pub fn versus_lock(all: &[Measured], m: &Measured) -> Option<f64> {
    let lock = find(all, &m.row.operation, Variant::Lock, m.row.tasks)?;
    (lock.row.ops_per_sec > 0.0).then(|| m.row.ops_per_sec / lock.row.ops_per_sec)
}

pub fn find<'a>(
    all: &'a [Measured],
    operation: &str,
    variant: Variant,
    tasks: usize,
) -> Option<&'a Measured> {
    all.iter()
        .find(|m| m.row.operation == operation && m.row.variant == variant && m.row.tasks == tasks)
}

/// The table, one line per row, a blank line between operations.
pub fn table(all: &[Measured]) -> String {
    let header = [
        "operation",
        "variant",
        "tasks",
        "ops/s",
        "p50",
        "p99",
        "round trips",
        "over-admitted",
        "lost updates",
        "vs lock",
    ];
    let mut lines: Vec<Option<[String; 10]>> = Vec::new();
    let mut previous = None;
    for m in all {
        if previous.is_some_and(|p| p != m.row.operation.as_str()) {
            lines.push(None);
        }
        previous = Some(m.row.operation.as_str());
        let r = &m.row;
        lines.push(Some([
            r.operation.clone(),
            r.variant.name().to_owned(),
            r.tasks.to_string(),
            thousands(r.ops_per_sec),
            duration(r.p50_us),
            duration(r.p99_us),
            format!("{:.2}", m.round_trips_per_call()),
            r.over_admissions.to_string(),
            r.lost_updates.to_string(),
            versus_lock(all, m).map_or("-".to_owned(), |x| format!("{x:.1}x")),
        ]));
    }
    let mut widths = header.map(|h| h.chars().count());
    for line in lines.iter().flatten() {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let render = |out: &mut String, cells: &[String]| {
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // Text columns to the left, numbers to the right.
            if i < 2 {
                let _ = write!(out, "{cell:<w$}  ");
            } else {
                let _ = write!(out, "{cell:>w$}  ");
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    render(&mut out, &header.map(str::to_owned));
    for line in &lines {
        match line {
            Some(cells) => render(&mut out, cells),
            None => out.push('\n'),
        }
    }
    out
}

/// The targets, as measured in this run, one line each; `cpu`
/// bounds the library's own overhead (see [`super::overhead`]).
pub fn targets(all: &[Measured], cpu: Option<&CpuCost>) -> Vec<String> {
    let mut lines = Vec::new();
    let hot = "counter, 1 key";
    if let (Some(script), Some(lock)) = (
        find(all, hot, Variant::Script, 64),
        find(all, hot, Variant::Lock, 64),
    ) {
        let x = script.row.ops_per_sec / lock.row.ops_per_sec.max(1.0);
        lines.push(format!(
            "{hot}, 64 tasks: script {} ops/s, lock {} ops/s: {x:.1}x (target >= 20x: {})",
            thousands(script.row.ops_per_sec),
            thousands(lock.row.ops_per_sec),
            verdict(x >= 20.0)
        ));
    }
    for m in all.iter().filter(|m| m.row.operation.ends_with("pauses")) {
        if m.row.variant != Variant::Lock {
            continue;
        }
        let others: Vec<String> = all
            .iter()
            .filter(|o| o.row.operation == m.row.operation && o.row.variant != Variant::Lock)
            .map(|o| {
                format!(
                    "{} {} over-admitted, {} lost",
                    o.row.variant.name(),
                    o.row.over_admissions,
                    o.row.lost_updates
                )
            })
            .collect();
        let clean = all
            .iter()
            .filter(|o| o.row.operation == m.row.operation && o.row.variant == Variant::Script)
            .all(|o| o.row.over_admissions == 0 && o.row.lost_updates == 0);
        lines.push(format!(
            "{}: lock {} over-admitted, {} lost; {} (target: script 0, lock > 0 of either: {})",
            m.row.operation,
            m.row.over_admissions,
            m.row.lost_updates,
            others.join("; "),
            verdict(clean && m.row.over_admissions + m.row.lost_updates > 0)
        ));
    }
    for tasks in [64, 1] {
        if let (Some(script), Some(raw)) = (
            find(all, hot, Variant::Script, tasks),
            find(all, hot, Variant::Raw, tasks),
        ) {
            let x = script.row.ops_per_sec / raw.row.ops_per_sec.max(1.0);
            let p50 = script.row.p50_us / raw.row.p50_us.max(0.1);
            lines.push(format!(
                "{hot}, {tasks} task{}, one connection: try_increment {} ops/s, p50 {}; \
                 raw EVALSHA {} ops/s, p50 {}: throughput {x:.3}x, p50 {p50:.3}x",
                if tasks == 1 { "" } else { "s" },
                thousands(script.row.ops_per_sec),
                duration(script.row.p50_us),
                thousands(raw.row.ops_per_sec),
                duration(raw.row.p50_us),
            ));
        }
    }
    if let (Some(cpu), Some(script)) = (cpu, find(all, hot, Variant::Script, 64)) {
        // One connection serves a call every 1/throughput; extra client work
        // per call can slow it by at most that share.
        let per_call_ns = 1e9 / script.row.ops_per_sec.max(1.0);
        let share = cpu.added_ns() / per_call_ns;
        lines.push(format!(
            "library's own cost per call, without I/O: try_increment {:.0} ns, raw EVALSHA {:.0} ns: \
             {:+.0} ns, {:.1}% of the {:.1} µs per call at 64 tasks (target within 5%: {})",
            cpu.script.as_nanos(),
            cpu.raw.as_nanos(),
            cpu.added_ns(),
            share * 100.0,
            per_call_ns / 1000.0,
            verdict(share <= 0.05)
        ));
    }
    lines
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// `1234567.0` as `1,234,567`.
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds in the unit a person reads best.
pub fn duration(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}
