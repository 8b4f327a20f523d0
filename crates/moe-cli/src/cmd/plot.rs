//! `moe bench --plot`: the rows as an SVG chart that reads at a glance: milliseconds per call
//! against tokens per call (M), both axes logarithmic, one line per shape and stage (and rung,
//! when several ran), and each shape's DRAM bound as a dashed line in the colour of its first
//! line, so the distance to the bound is the gap between a line and its dashes; with
//! `--peak-gmacs`, each shape's compute bound as a dotted line too.
//!
//! [`bench_chart`] turns a report into plain lines; moe-plot draws them, so the drawing is
//! tested without running a benchmark.

use std::path::Path;

use moe_plot::{Colour, Line, Panel, Stroke};

use super::CliError;
use super::bench::BenchReport;

/// The chart of a `moe bench` report: per shape, one line per stage (per rung too, when the
/// report has several), the DRAM bound, and with a peak the compute bound.
pub fn bench_chart(report: &BenchReport) -> Panel {
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
                colour: Colour::Palette(measured.len()),
                stroke: Stroke::Measured,
            }),
        }
        let s = &row.shape;
        let macs = (row.batch * s.top_k * 3 * s.hidden * s.intermediate) as f64;
        let compute = report
            .peak_gmacs
            .map(|g| (Stroke::Dotted, "compute", macs / (g * 1e9) * 1e3));
        let dram = Some((Stroke::Dashed, "DRAM", row.dram_bound_ms));
        for (stroke, what, ms) in [dram, compute].into_iter().flatten() {
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
                    colour: Colour::Palette(measured.len() - 1),
                    stroke,
                }),
            }
        }
    }
    for line in measured.iter_mut().chain(bounds.iter_mut()) {
        line.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    measured.extend(bounds);
    Panel {
        title: format!(
            "moe bench: {}, road {}, {} threads, rung {}",
            report.format_label, report.road, report.threads, report.isa
        ),
        lines: measured,
    }
}

/// Draws `chart` into the SVG file `path`.
pub fn write_svg(path: &Path, chart: &Panel) -> Result<(), CliError> {
    let svg = moe_plot::render_chart(chart).map_err(|e| CliError(e.to_string()))?;
    std::fs::write(path, svg).map_err(|e| CliError::context(path.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_plot_of_two_rows_has_its_names_and_axes() {
        let chart = bench_chart(&two_rows());
        assert_eq!(chart.lines.len(), 3, "{chart:?}");
        assert_eq!(chart.lines[1].stroke, Stroke::Dashed);
        // The bounds take the colour of their shape's line.
        assert!(chart.lines.iter().all(|l| l.colour == Colour::Palette(0)));
        // 1 token × 8 experts × 3·2048·768 MACs at 100 G MAC/s.
        let compute = &chart.lines[2];
        assert_eq!(compute.stroke, Stroke::Dotted);
        assert!((compute.points[0].1 - 0.3775).abs() < 1e-3, "{compute:?}");
        let file = std::env::temp_dir().join(format!("moe-plot-{}.svg", std::process::id()));
        write_svg(&file, &chart).expect("written");
        let svg = std::fs::read_to_string(&file).expect("read back");
        std::fs::remove_file(&file).ok();
        assert!(svg.trim_start().starts_with("<svg"), "{svg}");
        for needle in [
            "qwen3-30b-a3b experts",
            "qwen3-30b-a3b DRAM bound",
            "qwen3-30b-a3b compute bound",
            moe_plot::X_LABEL,
            moe_plot::Y_LABEL,
            "W4A8 (int4 groups of 32), road layer",
        ] {
            assert!(svg.contains(needle), "{needle:?} missing from\n{svg}");
        }
        // The measured line is drawn with its points; the bounds are dashed lines without.
        assert!(svg.contains("<circle"), "{svg}");
    }

    #[test]
    fn a_chart_without_positive_times_is_an_error() {
        let mut chart = bench_chart(&two_rows());
        for line in &mut chart.lines {
            for p in &mut line.points {
                p.1 = 0.0;
            }
        }
        let file = std::env::temp_dir().join(format!("moe-plot-empty-{}.svg", std::process::id()));
        let err = write_svg(&file, &chart).unwrap_err();
        assert!(err.0.contains("no positive times"), "{err}");
        assert!(!file.exists());
    }
}
