//! The GCRA comparison drawn as SVG (`cargo run --release -- --svg DIR`):
//! one chart of decisions per second and one of server time per decision,
//! each with the admit and deny regimes side by side and one colour per
//! library, the value written on every bar, on log scales.

use std::path::Path;

use plotters::prelude::*;

use crate::measure::Error;

/// One bar: a library's value in one regime.
pub struct Bar {
    pub library: String,
    pub regime: &'static str,
    pub value: f64,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(140, 190, 230),
    RGBColor(214, 39, 40),
    RGBColor(255, 160, 60),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draw `bars` grouped by regime into `file`, on a log scale (a reservoir's
/// figures are orders of magnitude from the others); `libraries` fixes the
/// order and the colours.
pub fn draw(
    file: &Path,
    title: &str,
    y_label: &str,
    libraries: &[String],
    bars: &[Bar],
) -> Result<(), Error> {
    let regimes: Vec<&str> = bars.iter().fold(Vec::new(), |mut seen, b| {
        if !seen.contains(&b.regime) {
            seen.push(b.regime);
        }
        seen
    });
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let root = SVGBackend::new(file, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let slots = regimes.len().max(1) as f64;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80);
    // Headroom above the tallest bar, for the legend.
    let floor = bars.iter().map(|b| b.value).fold(max, f64::min).max(1e-3) / 2.0;
    let mut chart = builder.build_cartesian_2d(0.0..slots, (floor..max * 30.0).log_scale())?;
    fill(&mut chart, &regimes, y_label, libraries, bars, floor)?;
    root.present()?;
    Ok(())
}

type Chart<'a, Y> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

/// Axes, bars from `floor` up with their values, and the legend.
fn fill<Y>(
    chart: &mut Chart<'_, Y>,
    regimes: &[&str],
    y_label: &str,
    libraries: &[String],
    bars: &[Bar],
    floor: f64,
) -> Result<(), Error>
where
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(regimes.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = (*x - 0.5).round();
            if (*x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                regimes
                    .get(i as usize)
                    .map_or(String::new(), |r| (*r).to_owned())
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()?;
    let width = 0.8 / libraries.len().max(1) as f64;
    for (i, regime) in regimes.iter().enumerate() {
        for (j, library) in libraries.iter().enumerate() {
            let Some(bar) = bars
                .iter()
                .find(|b| b.regime == *regime && &b.library == library)
            else {
                continue;
            };
            let x0 = i as f64 + 0.1 + j as f64 * width;
            let colour = PALETTE[j % PALETTE.len()];
            let top = bar.value.max(floor);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, floor), (x0 + width * 0.9, top)],
                colour.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                short(bar.value),
                (x0, top),
                ("sans-serif", 11),
            )))?;
        }
    }
    for (j, library) in libraries.iter().enumerate() {
        let colour = PALETTE[j % PALETTE.len()];
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(library.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// 129591 -> "130k", 6045 -> "6.0k", 9.61 -> "9.61".
fn short(v: f64) -> String {
    if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
