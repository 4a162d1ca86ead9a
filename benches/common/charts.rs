//! The comparison drawn as SVG charts (`compare -- --svg DIR`): throughput
//! of every operation, variant and tasks on one chart and by tasks on one
//! chart per operation (log scale), over-admissions under pauses, and the
//! hot-key runs. Plain grouped bars, one colour per variant,
//! the numbers written on the bars, so that a chart reads without the table.

use std::path::Path;

use plotters::prelude::*;

use super::hot_key::HotRun;
use super::run::Measured;
use super::subject::Variant;
use super::Result;

const VARIANTS: [Variant; 4] = [Variant::Script, Variant::Raw, Variant::Lock, Variant::Watch];

fn colour(v: Variant) -> RGBColor {
    match v {
        Variant::Script => RGBColor(31, 119, 180),
        Variant::Raw => RGBColor(140, 190, 230),
        Variant::Lock => RGBColor(214, 39, 40),
        Variant::Watch => RGBColor(255, 160, 60),
    }
}

/// One group of bars: a label and a value per variant present.
struct Group {
    label: String,
    bars: Vec<(Variant, f64)>,
}

/// Write every chart into `dir`, captioned with `stamp` (date, server,
/// command); returns the files written.
pub fn draw(dir: &Path, stamp: &str, measured: &[Measured], hot: &[HotRun]) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let label = |m: &Measured| format!("{}, {} tasks", m.row.operation, m.row.tasks);
    let throughput = groups(
        measured
            .iter()
            .filter(|m| !m.row.operation.contains("pauses")),
        label,
        |m| m.row.ops_per_sec,
    );
    let file = dir.join("throughput.svg");
    bars(
        &file,
        &format!("Calls per second, script vs raw EVALSHA vs lock vs WATCH (log scale) - {stamp}"),
        "calls per second",
        &throughput,
        Scale::Log,
        true,
    )?;
    written.push(file.display().to_string());
    // One chart per operation: its throughput by tasks, every variant.
    let mut operations: Vec<&str> = Vec::new();
    for m in measured
        .iter()
        .filter(|m| !m.row.operation.contains("pauses"))
    {
        if !operations.contains(&m.row.operation.as_str()) {
            operations.push(&m.row.operation);
        }
    }
    for operation in operations {
        let by_tasks = groups(
            measured.iter().filter(|m| m.row.operation == operation),
            |m| match m.row.tasks {
                1 => "1 task".to_owned(),
                n => format!("{n} tasks"),
            },
            |m| m.row.ops_per_sec,
        );
        let file = dir.join(format!("throughput_{}.svg", slug(operation)));
        bars(
            &file,
            &format!("{operation}: calls per second by tasks (log scale) - {stamp}"),
            "calls per second",
            &by_tasks,
            Scale::Log,
            true,
        )?;
        written.push(file.display().to_string());
    }
    let pauses = groups(
        measured
            .iter()
            .filter(|m| m.row.operation.contains("pauses")),
        label,
        |m| m.row.over_admissions as f64,
    );
    let file = dir.join("pauses.svg");
    bars(
        &file,
        &format!("Admissions beyond the limit, holders paused past the lock's TTL - {stamp}"),
        "over-admitted",
        &pauses,
        Scale::Linear,
        true,
    )?;
    written.push(file.display().to_string());
    // One bar a run: red for one call per decision, blue for a reservoir.
    let hot_groups: Vec<Group> = hot
        .iter()
        .map(|run| {
            let one_call = run.label.contains("one call per decision");
            Group {
                label: run
                    .label
                    .replace("Limiter::check, one call per decision", "one call each")
                    .replace("Reservoir, ", "reservoir, "),
                bars: vec![(
                    if one_call {
                        Variant::Lock
                    } else {
                        Variant::Script
                    },
                    run.per_second(),
                )],
            }
        })
        .collect();
    let file = dir.join("hot_key.svg");
    bars(
        &file,
        &format!(
            "One hot limit: decisions per second, one call each vs Reservoir (log scale) - {stamp}"
        ),
        "decisions per second",
        &hot_groups,
        Scale::Log,
        false,
    )?;
    written.push(file.display().to_string());
    Ok(written)
}

fn groups<'a>(
    rows: impl Iterator<Item = &'a Measured>,
    label: impl Fn(&Measured) -> String,
    value: impl Fn(&Measured) -> f64,
) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for m in rows {
        let name = label(m);
        match out.iter_mut().find(|g| g.label == name) {
            Some(g) => g.bars.push((m.row.variant, value(m))),
            None => out.push(Group {
                label: name,
                bars: vec![(m.row.variant, value(m))],
            }),
        }
    }
    out
}

/// How the value axis is drawn.
#[derive(Clone, Copy, PartialEq)]
enum Scale {
    Log,
    Linear,
}

fn bars(
    file: &Path,
    title: &str,
    y_label: &str,
    groups: &[Group],
    scale: Scale,
    with_legend: bool,
) -> Result<()> {
    let width = 160 + 190 * groups.len().max(1) as u32;
    let root = SVGBackend::new(file, (width.max(800), 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.1))
        .fold(1.0_f64, f64::max);
    let slots = groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(80)
        // Headroom above the tallest bar, for the legend.
        .build_cartesian_2d(0.0..slots, (0.5..max * 40.0).log_scale())?;
    if scale == Scale::Linear {
        // Counts: a linear axis from zero reads better.
        drop(chart);
        let mut linear = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(60)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..slots, 0.0..max * 1.4)?;
        frame(&mut linear, groups, y_label)?;
        draw_bars(&mut linear, groups, 0.0)?;
        if with_legend {
            legend(&mut linear)?;
        }
        root.present()?;
        return Ok(());
    }
    frame(&mut chart, groups, y_label)?;
    draw_bars(&mut chart, groups, 0.5)?;
    if with_legend {
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

type Chart<'a, Y> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

fn frame<Y>(chart: &mut Chart<'_, Y>, groups: &[Group], y_label: &str) -> Result<()>
where
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let names: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len().max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let i = (*x - 0.5).round();
            if (*x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()?;
    Ok(())
}

fn draw_bars<Y>(chart: &mut Chart<'_, Y>, groups: &[Group], floor: f64) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for (i, group) in groups.iter().enumerate() {
        let n = group.bars.len().max(1) as f64;
        let width = 0.8 / n;
        for (j, (variant, value)) in group.bars.iter().enumerate() {
            let x0 = i as f64 + 0.1 + j as f64 * width;
            let top = value.max(floor);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, floor), (x0 + width * 0.9, top)],
                colour(*variant).filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                short(*value),
                (x0, top),
                ("sans-serif", 11),
            )))?;
        }
    }
    Ok(())
}

fn legend<Y>(chart: &mut Chart<'_, Y>) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for v in VARIANTS {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(v.name())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour(v).filled())
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// "counter, 1000 keys" -> "counter_1000_keys": a file name.
fn slug(operation: &str) -> String {
    let words: Vec<String> = operation
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words.join("_")
}

/// 129591 -> "130k", 6045 -> "6.0k", 122 -> "122".
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
