//! `bench-peers --plot`: the table as an SVG chart that reads at a glance: one panel per shape,
//! milliseconds per call against tokens per call (M) on log axes, one line per side (ours and
//! each peer path) and the DRAM bound dashed, so who is ahead at which M, and how far from the
//! bound, is the order of the lines.

use std::path::Path;

use plotters::prelude::*;

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
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
];

/// One line: `(M, ms)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Its name in the legend.
    pub name: String,
    /// `(tokens per call, ms per call)`.
    pub points: Vec<(f64, f64)>,
    /// A bound (dashed, black) rather than a measurement (solid, with points).
    pub bound: bool,
}

/// One shape's lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The panel's caption (the shape).
    pub title: String,
    /// Its lines; a measured line keeps its colour across panels by its place in the list.
    pub lines: Vec<Line>,
}

/// The span of positive, finite values, widened so that no point sits on the frame.
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

/// Draws `panels` under `title` as SVG text, up to three panels a row. Points that are not
/// positive and finite are left out (log axes); a panel without any is drawn empty, and
/// panels without any point at all are an error.
pub fn render_svg(title: &str, panels: &[Panel]) -> Result<String, String> {
    if panels.iter().all(|p| {
        span(
            p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.1)),
            1.0,
        )
        .is_none()
    }) {
        return Err("no times to plot".into());
    }
    let cols = panels.len().clamp(1, 3);
    let rows = panels.len().div_ceil(cols);
    let size = (560 * cols as u32, 480 * rows as u32 + 40);
    let draw_err = |e: DrawingAreaErrorKind<_>| format!("drawing the chart: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root.titled(title, ("sans-serif", 18)).map_err(draw_err)?;
        for (area, panel) in root.split_evenly((rows, cols)).iter().zip(panels) {
            let points = || panel.lines.iter().flat_map(|l| l.points.iter().copied());
            let (Some((x0, x1)), Some((y0, y1))) = (
                span(points().map(|p| p.0), 1.4),
                span(points().map(|p| p.1), 1.6),
            ) else {
                continue;
            };
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(44)
                .y_label_area_size(64)
                .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                .map_err(draw_err)?;
            chart
                .configure_mesh()
                .x_desc(X_LABEL)
                .y_desc(Y_LABEL)
                .x_label_formatter(&|v| tick(*v))
                .y_label_formatter(&|v| tick(*v))
                .draw()
                .map_err(draw_err)?;
            for (i, line) in panel.lines.iter().enumerate() {
                let points: Vec<(f64, f64)> = line
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && *x > 0.0 && y.is_finite() && *y > 0.0)
                    .collect();
                let style = if line.bound {
                    BLACK.stroke_width(1)
                } else {
                    PALETTE[i % PALETTE.len()].stroke_width(2)
                };
                let anno = if line.bound {
                    chart.draw_series(DashedLineSeries::new(points, 6, 4, style))
                } else {
                    chart.draw_series(LineSeries::new(points, style).point_size(3))
                }
                .map_err(draw_err)?;
                anno.label(line.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Draws `panels` into the SVG file `path`.
pub fn write_svg(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let svg = render_svg(title, panels)?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The names of `svg`'s elements if its tags nest properly (every opened element closed
    /// in order, one root), or where they do not.
    pub(crate) fn element_names(svg: &str) -> Result<Vec<String>, String> {
        let (mut open, mut names, mut roots) = (Vec::<String>::new(), Vec::new(), 0);
        let mut rest = svg;
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
                    Some(o) if o == name.trim() => continue,
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
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
        match (open.is_empty(), roots) {
            (true, 1) => Ok(names),
            (false, _) => Err(format!("never closed: {open:?}")),
            (true, n) => Err(format!("{n} root elements")),
        }
    }

    #[test]
    fn the_tag_checker_rejects_what_is_not_well_formed() {
        assert!(element_names("<svg><g></svg>").is_err());
        assert!(element_names("<svg></svg><svg></svg>").is_err());
        assert!(element_names("<svg><text>a</text><path d=\"\"/></svg>").is_ok());
    }

    #[test]
    fn panels_without_times_are_an_error() {
        let empty = Panel {
            title: "qwen3-30b-a3b".into(),
            lines: vec![Line {
                name: "ours".into(),
                points: vec![(1.0, f64::NAN)],
                bound: false,
            }],
        };
        assert!(render_svg("t", &[empty]).is_err());
    }
}
