//! `moe bench --plot`: the rows as an SVG chart that reads at a glance: milliseconds per call
//! against tokens per call (M), both axes logarithmic, one line per shape and stage (and rung,
//! when several ran), and each shape's DRAM bound as a dashed line in the colour of its first
//! line, so the distance to the bound is the gap between a line and its dashes; with
//! `--peak-gmacs`, each shape's compute bound as a dotted line too.
//!
//! [`bench_chart`] turns a report into plain lines; [`render_svg`] draws any [`Chart`], so the
//! drawing is tested without running a benchmark.

use std::path::Path;

use plotters::prelude::*;

use super::CliError;
use super::bench::BenchReport;

/// The x axis' label.
pub const X_LABEL: &str = "M (tokens per call)";
/// The y axis' label.
pub const Y_LABEL: &str = "ms per call";

/// Colours of the lines, in order; distinguishable and legible on white.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

/// One line of a chart: `(M, ms)` points in increasing M.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Its name in the legend.
    pub name: String,
    /// `(tokens per call, ms per call)`.
    pub points: Vec<(f64, f64)>,
    /// Index into the palette.
    pub color: usize,
    /// What the line shows, and so how it is drawn.
    pub kind: LineKind,
}

/// What a line shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// Measured times: solid, with points.
    Measured,
    /// The time the weights take to stream from DRAM: dashed, thin.
    DramBound,
    /// The time the multiply-accumulates take at the given peak: dotted, thin.
    ComputeBound,
}

/// A titled set of lines on shared log axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The caption.
    pub title: String,
    /// The lines, measurements first.
    pub lines: Vec<Line>,
}

/// The chart of a `moe bench` report: per shape, one line per stage (per rung too, when the
/// report has several) and the DRAM bound.
pub fn bench_chart(report: &BenchReport) -> Chart {
    let several_rungs = report
        .rows
        .iter()
        .any(|r| r.isa != report.rows.first().map_or("", |f| f.isa));
    let mut measured: Vec<Line> = Vec::new();
    let mut bounds: Vec<Line> = Vec::new();
    for row in &report.rows {
        let name = if several_rungs {
            format!("{} {} {}", row.shape.name, row.stage, row.isa)
        } else {
            format!("{} {}", row.shape.name, row.stage)
        };
        let point = (row.batch as f64, row.ms_per_call);
        match measured.iter_mut().find(|l| l.name == name) {
            Some(line) => line.points.push(point),
            None => measured.push(Line {
                name,
                points: vec![point],
                color: measured.len(),
                kind: LineKind::Measured,
            }),
        }
        let s = &row.shape;
        let macs = (row.batch * s.top_k * 3 * s.hidden * s.intermediate) as f64;
        let compute = report
            .peak_gmacs
            .map(|g| (LineKind::ComputeBound, "compute", macs / (g * 1e9) * 1e3));
        let dram = Some((LineKind::DramBound, "DRAM", row.dram_bound_ms));
        for (kind, what, ms) in [dram, compute].into_iter().flatten() {
            let name = format!("{} {what} bound", s.name);
            let point = (row.batch as f64, ms);
            match bounds.iter_mut().find(|l| l.name == name) {
                Some(line) => {
                    if !line.points.iter().any(|p| p.0 == point.0) {
                        line.points.push(point);
                    }
                }
                None => bounds.push(Line {
                    name,
                    points: vec![point],
                    color: measured.len() - 1,
                    kind,
                }),
            }
        }
    }
    for line in measured.iter_mut().chain(bounds.iter_mut()) {
        line.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    measured.extend(bounds);
    Chart {
        title: format!(
            "moe bench: {}, road {}, {} threads, rung {}",
            report.format_label, report.road, report.threads, report.isa
        ),
        lines: measured,
    }
}

/// The span of positive, finite values, widened so that no point sits on the frame (and a
/// single value still spans a range).
fn span(values: impl Iterator<Item = f64>, widen: f64) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (hi > 0.0).then_some((lo / widen, hi * widen))
}

/// A tick label: whole numbers from 100, otherwise up to three decimals without trailing
/// zeros (`0.01`, `2.5`), and powers of ten below a thousandth.
fn tick(v: f64) -> String {
    if v >= 100.0 {
        return format!("{v:.0}");
    }
    if v < 1e-3 {
        return format!("{v:.0e}");
    }
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws `chart` as SVG text. Points that are not positive and finite are left out (log
/// axes); a chart without any is an error.
pub fn render_svg(chart: &Chart) -> Result<String, CliError> {
    let points = || chart.lines.iter().flat_map(|l| l.points.iter().copied());
    let (Some((x0, x1)), Some((y0, y1))) = (
        span(points().map(|p| p.0), 1.4),
        span(points().map(|p| p.1), 1.6),
    ) else {
        return Err(CliError("no rows with positive times to plot".into()));
    };
    let draw_err = |e: DrawingAreaErrorKind<_>| CliError::context("drawing the chart", e);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let mut plot = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 18))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(draw_err)?;
        plot.configure_mesh()
            .x_desc(X_LABEL)
            .y_desc(Y_LABEL)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(draw_err)?;
        for line in &chart.lines {
            let color = PALETTE[line.color % PALETTE.len()];
            let points: Vec<(f64, f64)> = line
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && *x > 0.0 && y.is_finite() && *y > 0.0)
                .collect();
            let width = if line.kind == LineKind::Measured {
                2
            } else {
                1
            };
            let style = color.stroke_width(width);
            let anno = match line.kind {
                LineKind::Measured => {
                    plot.draw_series(LineSeries::new(points, style).point_size(3))
                }
                LineKind::DramBound => plot.draw_series(DashedLineSeries::new(points, 6, 4, style)),
                LineKind::ComputeBound => {
                    plot.draw_series(DashedLineSeries::new(points, 2, 3, style))
                }
            }
            .map_err(draw_err)?;
            anno.label(line.name.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
            });
        }
        plot.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Draws `chart` into the SVG file `path`.
pub fn write_svg(path: &Path, chart: &Chart) -> Result<(), CliError> {
    let svg = render_svg(chart)?;
    std::fs::write(path, svg).map_err(|e| CliError::context(path.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of `svg`'s elements if its tags nest properly (every opened element closed
    /// in order, one root), or where they do not.
    fn element_names(svg: &str) -> Result<Vec<String>, String> {
        let mut open: Vec<String> = Vec::new();
        let mut names = Vec::new();
        let mut rest = svg;
        let mut roots = 0;
        while let Some(start) = rest.find('<') {
            let end = rest[start..]
                .find('>')
                .ok_or_else(|| format!("unclosed tag at {:?}", &rest[start..]))?;
            let tag = &rest[start + 1..start + end];
            rest = &rest[start + end + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                match open.pop() {
                    Some(o) if o == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let name = tag
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap_or("")
                .to_string();
            if name.is_empty() {
                return Err(format!("empty tag <{tag}>"));
            }
            if open.is_empty() {
                roots += 1;
            }
            names.push(name.clone());
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        if !open.is_empty() {
            return Err(format!("never closed: {open:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} root elements"));
        }
        Ok(names)
    }

    /// A report of two fake rows: one shape, one stage, M = 1 and 16.
    fn two_rows() -> BenchReport {
        use super::super::bench::{BenchFormat, BenchRow, BenchShape};
        let row = |batch: usize, ms: f64, bound: f64| BenchRow {
            shape: BenchShape {
                name: "qwen3-30b-a3b".into(),
                experts: 128,
                top_k: 8,
                hidden: 2048,
                intermediate: 768,
            },
            isa: "avx2",
            stage: "experts",
            ops: Vec::new(),
            copies: 7,
            distinct_bytes: 1 << 31,
            batch,
            ms_per_call: ms,
            tokens_per_s: batch as f64 / ms * 1e3,
            experts_touched: 8.0,
            bytes_touched: 1e6,
            weight_gb_per_s: 1.0,
            gmac_per_s: 1.0,
            dram_bound_ms: bound,
            dram_ratio: bound / ms,
            stages: None,
        };
        BenchReport {
            format: BenchFormat::W4a8,
            format_label: "W4A8 (int4 groups of 32)".into(),
            road: "layer",
            threads: 2,
            dram_bytes_per_s: 28.8e9,
            dram_source: "given",
            peak_gmacs: Some(100.0),
            isa: "avx2",
            rows: vec![row(1, 0.9, 0.7), row(16, 9.5, 7.4)],
        }
    }

    #[test]
    fn a_plot_of_two_rows_is_well_formed_svg_with_its_names_and_axes() {
        let chart = bench_chart(&two_rows());
        assert_eq!(chart.lines.len(), 3, "{chart:?}");
        // 1 token × 8 experts × 3·2048·768 MACs at 100 G MAC/s.
        let compute = &chart.lines[2];
        assert_eq!(compute.kind, LineKind::ComputeBound);
        assert!((compute.points[0].1 - 0.3775).abs() < 1e-3, "{compute:?}");
        let file = std::env::temp_dir().join(format!("moe-plot-{}.svg", std::process::id()));
        write_svg(&file, &chart).expect("written");
        let svg = std::fs::read_to_string(&file).expect("read back");
        std::fs::remove_file(&file).ok();
        let names = element_names(&svg).unwrap_or_else(|e| panic!("{e}:\n{svg}"));
        assert_eq!(names.first().map(String::as_str), Some("svg"), "{svg}");
        assert!(names.iter().any(|n| n == "text"), "{names:?}");
        for needle in [
            "qwen3-30b-a3b experts",
            "qwen3-30b-a3b DRAM bound",
            "qwen3-30b-a3b compute bound",
            X_LABEL,
            Y_LABEL,
            "W4A8 (int4 groups of 32), road layer",
        ] {
            assert!(svg.contains(needle), "{needle:?} missing from\n{svg}");
        }
        // The measured line is drawn with its points; the bound is a dashed line without.
        assert!(svg.contains("<circle"), "{svg}");
    }

    #[test]
    fn ticks_read_as_plain_numbers() {
        let ticks: Vec<String> = [0.01, 0.1, 2.5, 10.0, 1024.0, 1e-4].map(tick).to_vec();
        assert_eq!(ticks, ["0.01", "0.1", "2.5", "10", "1024", "1e-4"]);
    }

    #[test]
    fn the_tag_checker_rejects_what_is_not_well_formed() {
        assert!(element_names("<svg><g></svg>").is_err());
        assert!(element_names("<svg></svg><svg></svg>").is_err());
        assert!(element_names("<svg><text>a</text><path d=\"\"/></svg>").is_ok());
    }

    #[test]
    fn a_chart_without_positive_times_is_an_error() {
        let mut chart = bench_chart(&two_rows());
        for line in &mut chart.lines {
            for p in &mut line.points {
                p.1 = 0.0;
            }
        }
        assert!(render_svg(&chart).unwrap_err().0.contains("no rows"));
    }
}
