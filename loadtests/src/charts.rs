//! Charts with plotters, each written as PNG and SVG: the six sweep panels against the swept
//! variable (token throughput; request rate, the server's completed against the client's
//! offered; median / P99 ITL and TPOT on log axes; TTFT; TTLT), several result sets overlaid;
//! and grouped bars comparing mixed-scenario results. Dashed lines (with triangles) are the
//! second metric of a panel, and the legend shows them so; each panel leaves room above its
//! lines for the legend, so it never hides one.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{anyhow, bail, Result};
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::points::{SweepPoint, SweepVar};

/// One result set: a legend label and its points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in any order (sorted by x when drawn).
    pub points: Vec<SweepPoint>,
}

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
const SIZE: (u32, u32) = (1800, 1650);

/// Registers the bundled font for bitmap text (once).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, FONT);
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e:?}")
}

/// One line of a panel: which series, which metric, solid or dashed.
struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// Draws the six sweep panels to `<base>.png` and `<base>.svg`.
pub fn draw_sweep(series: &[Series], var: SweepVar, title: &str, base: &Path) -> Result<(PathBuf, PathBuf)> {
    if series.iter().all(|s| s.points.is_empty()) {
        bail!("nothing to chart: no points");
    }
    register_font();
    let png = base.with_extension("png");
    let svg = base.with_extension("svg");
    draw_sweep_on(BitMapBackend::new(&png, SIZE).into_drawing_area(), series, var, title)?;
    draw_sweep_on(SVGBackend::new(&svg, SIZE).into_drawing_area(), series, var, title)?;
    Ok((png, svg))
}

/// `(legend suffix, dashed, value)` of one metric drawn per series.
type MetricSpec<'a> = (&'a str, bool, fn(&SweepPoint) -> f64);

fn lines_of(series: &[Series], metrics: &[MetricSpec]) -> Vec<Line> {
    let mut out = vec![];
    for (i, s) in series.iter().enumerate() {
        let mut pts = s.points.clone();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        for (name, dashed, f) in metrics {
            let label = if name.is_empty() { s.label.clone() } else { format!("{} {name}", s.label) };
            out.push(Line {
                label,
                color: COLORS[i % COLORS.len()],
                dashed: *dashed,
                points: pts.iter().map(|p| (p.x, f(p))).collect(),
            });
        }
    }
    out
}

fn draw_sweep_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[Series],
    var: SweepVar,
    title: &str,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 30)).map_err(err)?;
    let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).collect();
    let (xmin, xmax) =
        (xs.iter().copied().fold(f64::INFINITY, f64::min), xs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    let log = xmin > 0.0 && xmax / xmin >= 8.0;
    let offered: MetricSpec = ("client (offered)", true, |p| p.x);
    let rate: &[MetricSpec] = match var {
        SweepVar::RequestRate => &[("server (completed)", false, |p| p.request_throughput), offered],
        SweepVar::MaxConcurrency => &[("server (completed)", false, |p| p.request_throughput)],
    };
    let specs: [(&str, Vec<Line>, bool); 6] = [
        (
            "Token throughput (tok/s)",
            lines_of(
                series,
                &[("output", false, |p| p.output_throughput), ("total", true, |p| p.total_token_throughput)],
            ),
            false,
        ),
        ("Request rate (req/s): server vs client", lines_of(series, rate), false),
        (
            "Inter-token latency (ms, log)",
            lines_of(series, &[("median ITL", false, |p| p.median_itl_ms), ("P99 ITL", true, |p| p.p99_itl_ms)]),
            true,
        ),
        (
            "Time per output token (ms, log)",
            lines_of(series, &[("median TPOT", false, |p| p.median_tpot_ms), ("P99 TPOT", true, |p| p.p99_tpot_ms)]),
            true,
        ),
        (
            "Time to first token (ms)",
            lines_of(series, &[("mean TTFT", false, |p| p.mean_ttft_ms), ("P99 TTFT", true, |p| p.p99_ttft_ms)]),
            false,
        ),
        ("Mean time to last token (ms)", lines_of(series, &[("", false, |p| p.mean_e2el_ms)]), false),
    ];
    for (area, (caption, lines, log_y)) in root.split_evenly((3, 2)).iter().zip(specs) {
        let ys: Vec<f64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).collect();
        let top = ys.iter().copied().fold(0.0, f64::max).max(1e-9);
        // Room above the lines for the legend: one row per entry.
        let rows = lines.len() as f64;
        let x = |a: &DrawingArea<DB, Shift>| -> Result<()> {
            let label = var.axis_label();
            match (log, log_y) {
                (false, false) => panel(a, xrange(xmin, xmax), 0.0..top * (1.15 + 0.1 * rows), caption, label, &lines),
                (true, false) => panel(
                    a,
                    (xmin / 1.25..xmax * 1.25).log_scale(),
                    0.0..top * (1.15 + 0.1 * rows),
                    caption,
                    label,
                    &lines,
                ),
                (lx, true) => {
                    let low = ys.iter().copied().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min).min(top) / 1.5;
                    let high = top * 10f64.powf(0.15 + 0.12 * rows) * (top / low).powf(0.1 * rows);
                    if lx {
                        panel(
                            a,
                            (xmin / 1.25..xmax * 1.25).log_scale(),
                            (low..high).log_scale(),
                            caption,
                            label,
                            &lines,
                        )
                    } else {
                        panel(a, xrange(xmin, xmax), (low..high).log_scale(), caption, label, &lines)
                    }
                }
            }
        };
        x(area)?;
    }
    root.present().map_err(err)
}

fn xrange(xmin: f64, xmax: f64) -> std::ops::Range<f64> {
    let pad = ((xmax - xmin) * 0.05).max(0.5);
    (xmin - pad).max(0.0)..xmax + pad
}

fn panel<DB, XS, YS>(
    area: &DrawingArea<DB, Shift>,
    xs: XS,
    ys: YS,
    caption: &str,
    xlabel: &str,
    lines: &[Line],
) -> Result<()>
where
    DB: DrawingBackend,
    XS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    YS: AsRangedCoord<Value = f64>,
    YS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 24))
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(xs, ys)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&|v| trim_num(*v))
        .y_label_formatter(&|v| trim_num(*v))
        .draw()
        .map_err(err)?;
    for l in lines {
        let style = l.color.stroke_width(3);
        let anno = if l.dashed {
            chart.draw_series(DashedLineSeries::new(l.points.clone(), 12, 6, style)).map_err(err)?
        } else {
            chart.draw_series(LineSeries::new(l.points.clone(), style)).map_err(err)?
        };
        let (color, dashed) = (l.color, l.dashed);
        // The legend entry looks like the line: dashed or solid, with its marker.
        let s = color.stroke_width(3);
        let anno = anno.label(l.label.clone());
        if dashed {
            anno.legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (9, 0)], s)
                    + PathElement::new(vec![(15, 0), (24, 0)], s)
                    + TriangleMarker::new((12, 0), 6, color.filled())
            });
        } else {
            anno.legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (24, 0)], s)
                    + Circle::new((12, 0), 5, color.filled())
            });
        }
        let marker = |(x, y): (f64, f64)| -> DynElement<'static, DB, (f64, f64)> {
            if dashed {
                TriangleMarker::new((x, y), 7, l.color.filled()).into_dyn()
            } else {
                Circle::new((x, y), 5, l.color.filled()).into_dyn()
            }
        };
        chart.draw_series(l.points.iter().map(|&p| marker(p))).map_err(err)?;
    }
    // The range leaves the top free for the legend, on the side where the lines end lower.
    let ends = |last: bool| {
        lines
            .iter()
            .filter_map(|l| if last { l.points.last() } else { l.points.first() })
            .map(|p| p.1)
            .fold(0.0, f64::max)
    };
    let corner =
        if ends(false) <= ends(true) { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::UpperRight };
    chart
        .configure_series_labels()
        .position(corner)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// `12`, `2.5`, `0.125`, `1.2k`: short tick labels.
fn trim_num(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// One group of bars: a metric name and one value per result set.
#[derive(Debug, Clone)]
pub struct BarGroup {
    /// Metric shown under the group.
    pub name: String,
    /// Values in the order of the labels.
    pub values: Vec<f64>,
}

/// Grouped bars (one color per label) to `<base>.png` and `<base>.svg`.
pub fn draw_bars(
    labels: &[String],
    groups: &[BarGroup],
    y_desc: &str,
    title: &str,
    base: &Path,
) -> Result<(PathBuf, PathBuf)> {
    register_font();
    let png = base.with_extension("png");
    let svg = base.with_extension("svg");
    draw_bars_on(BitMapBackend::new(&png, (1400, 800)).into_drawing_area(), labels, groups, y_desc, title)?;
    draw_bars_on(SVGBackend::new(&svg, (1400, 800)).into_drawing_area(), labels, groups, y_desc, title)?;
    Ok((png, svg))
}

fn draw_bars_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    labels: &[String],
    groups: &[BarGroup],
    y_desc: &str,
    title: &str,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let ymax = groups.iter().flat_map(|g| g.values.iter().copied()).fold(0.0, f64::max).max(1e-9) * 1.15;
    let n = groups.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 28))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..ymax)
        .map_err(err)?;
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len().max(1))
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .y_label_formatter(&|v| trim_num(*v))
        .draw()
        .map_err(err)?;
    let k = labels.len().max(1) as f64;
    let width = 0.8 / k;
    for (li, label) in labels.iter().enumerate() {
        let color = COLORS[li % COLORS.len()];
        let bars = groups.iter().enumerate().map(move |(gi, g)| {
            let x0 = gi as f64 - 0.4 + li as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.92, g.values.get(li).copied().unwrap_or(0.0))], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
        let values = groups.iter().enumerate().map(move |(gi, g)| {
            let v = g.values.get(li).copied().unwrap_or(0.0);
            let x = gi as f64 - 0.4 + (li as f64 + 0.46) * width;
            let style = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
            Text::new(format!("{v:.2}"), (x, v + ymax * 0.005), style)
        });
        chart.draw_series(values).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(trim_num(4.0), "4");
        assert_eq!(trim_num(2.5), "2.5");
        assert_eq!(trim_num(0.125), "0.125");
        assert_eq!(trim_num(123.4), "123");
        assert_eq!(trim_num(12_000.0), "12k");
    }
}
