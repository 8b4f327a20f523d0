//! Drawing panels as SVG text with plotters: the frame, the log axes, the lines and the legend.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::chart::{Colour, Panel, Stroke, X_LABEL, Y_LABEL};
use crate::error::PlotError;
use crate::scale::{span, tick};

/// Colours of [`Colour::Palette`], in order; distinguishable and legible on white.
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

/// The room a panel gives its caption and axis labels, in pixels.
struct Frame {
    /// The caption's font size.
    caption: u32,
    /// The blank margin around the panel.
    margin: u32,
    /// The height of the x axis' tick labels and description.
    x_labels: u32,
    /// The width of the y axis' tick labels and description.
    y_labels: u32,
}

/// A chart alone on its page has room to spare.
const CHART_FRAME: Frame = Frame {
    caption: 18,
    margin: 16,
    x_labels: 48,
    y_labels: 72,
};

/// A panel of a grid shares the page, so its frame is tighter.
const GRID_FRAME: Frame = Frame {
    caption: 16,
    margin: 12,
    x_labels: 44,
    y_labels: 64,
};

/// The size of [`render_chart`]'s page.
const CHART_SIZE: (u32, u32) = (1000, 640);
/// The size of one panel of [`render_grid`].
const GRID_CELL: (u32, u32) = (560, 480);
/// The height of [`render_grid`]'s title above the panels.
const GRID_TITLE_HEIGHT: u32 = 40;
/// The most panels [`render_grid`] puts side by side.
const GRID_COLUMNS: usize = 3;

/// The x and y ranges of a panel's axes.
type Ranges = ((f64, f64), (f64, f64));

/// The axes' ranges of `panel`: the span of its positive, finite coordinates, widened so that
/// no point sits on the frame; `None` when it has nothing a log axis can show.
fn ranges(panel: &Panel) -> Option<Ranges> {
    let points = || panel.lines.iter().flat_map(|l| l.points.iter().copied());
    Some((
        span(points().map(|p| p.0), 1.4)?,
        span(points().map(|p| p.1), 1.6)?,
    ))
}

/// A plotters failure as a [`PlotError`].
fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draws `panel` as one chart filling the page, its title as the caption. Points that are not
/// positive and finite are left out (log axes); a panel without any is an error.
pub fn render_chart(panel: &Panel) -> Result<String, PlotError> {
    let ranges = ranges(panel).ok_or(PlotError::NoTimes)?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, CHART_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        draw_panel(&root, panel, ranges, &CHART_FRAME)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Draws `panels` under `title`, up to three a row. Points that are not positive and finite are
/// left out (log axes); a panel without any is left empty, and panels without any point at all
/// are an error.
pub fn render_grid(title: &str, panels: &[Panel]) -> Result<String, PlotError> {
    let ranges: Vec<Option<Ranges>> = panels.iter().map(ranges).collect();
    if ranges.iter().all(Option::is_none) {
        return Err(PlotError::NoTimes);
    }
    let cols = panels.len().clamp(1, GRID_COLUMNS);
    let rows = panels.len().div_ceil(cols);
    // At most a few dozen shapes, so the products stay far below u32::MAX.
    let size = (
        GRID_CELL.0 * cols as u32,
        GRID_CELL.1 * rows as u32 + GRID_TITLE_HEIGHT,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root
            .titled(title, ("sans-serif", CHART_FRAME.caption))
            .map_err(draw_err)?;
        let areas = root.split_evenly((rows, cols));
        for ((area, panel), ranges) in areas.iter().zip(panels).zip(ranges) {
            if let Some(ranges) = ranges {
                draw_panel(area, panel, ranges, &GRID_FRAME)?;
            }
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Draws `panel` into `area` on log axes spanning `ranges`, with its legend in the upper left.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    panel: &Panel,
    ((x0, x1), (y0, y1)): Ranges,
    frame: &Frame,
) -> Result<(), PlotError> {
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", frame.caption))
        .margin(frame.margin)
        .x_label_area_size(frame.x_labels)
        .y_label_area_size(frame.y_labels)
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
    for line in &panel.lines {
        let colour = match line.colour {
            Colour::Palette(i) => PALETTE[i % PALETTE.len()],
            Colour::Black => BLACK,
        };
        let width = if line.stroke == Stroke::Measured {
            2
        } else {
            1
        };
        let style = colour.stroke_width(width);
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && *x > 0.0 && y.is_finite() && *y > 0.0)
            .collect();
        let anno = match line.stroke {
            Stroke::Measured => chart.draw_series(LineSeries::new(points, style).point_size(3)),
            Stroke::Dashed => chart.draw_series(DashedLineSeries::new(points, 6, 4, style)),
            Stroke::Dotted => chart.draw_series(DashedLineSeries::new(points, 2, 3, style)),
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::Line;

    /// The names of `svg`'s elements if its tags nest properly (every opened element closed
    /// in order, one root), or where they do not.
    fn element_names(svg: &str) -> Result<Vec<String>, String> {
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

    /// A line named `name` of the given colour and stroke.
    fn line(name: &str, points: &[(f64, f64)], colour: Colour, stroke: Stroke) -> Line {
        Line {
            name: name.into(),
            points: points.to_vec(),
            colour,
            stroke,
        }
    }

    /// A panel with one line of each stroke.
    fn three_lines(title: &str) -> Panel {
        Panel {
            title: title.into(),
            lines: vec![
                line(
                    "measured",
                    &[(1.0, 0.9), (16.0, 9.5)],
                    Colour::Palette(0),
                    Stroke::Measured,
                ),
                line(
                    "dram",
                    &[(1.0, 0.7), (16.0, 7.4)],
                    Colour::Palette(0),
                    Stroke::Dashed,
                ),
                line(
                    "compute",
                    &[(1.0, 0.1), (16.0, 1.6)],
                    Colour::Black,
                    Stroke::Dotted,
                ),
            ],
        }
    }

    /// Checks that `svg` is well-formed and holds every needle.
    fn assert_svg_holds(svg: &str, needles: &[&str]) {
        let names = element_names(svg).unwrap_or_else(|e| panic!("{e}:\n{svg}"));
        assert_eq!(names.first().map(String::as_str), Some("svg"), "{svg}");
        assert!(names.iter().any(|n| n == "text"), "{names:?}");
        for needle in needles {
            assert!(svg.contains(needle), "{needle:?} missing from\n{svg}");
        }
    }

    #[test]
    fn the_tag_checker_rejects_what_is_not_well_formed() {
        assert!(element_names("<svg><g></svg>").is_err());
        assert!(element_names("<svg></svg><svg></svg>").is_err());
        assert!(element_names("<svg><text>a</text><path d=\"\"/></svg>").is_ok());
    }

    #[test]
    fn a_chart_is_well_formed_svg_with_its_title_lines_and_axes() {
        let svg = render_chart(&three_lines("the title")).expect("drawn");
        let needles = ["the title", "measured", "dram", "compute", X_LABEL, Y_LABEL];
        assert_svg_holds(&svg, &needles);
        assert!(svg.contains(r#"width="1000" height="640""#), "{svg}");
        // The measured line is drawn with its points; the bounds are dashed lines without.
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
    }

    #[test]
    fn a_grid_draws_each_panel_and_leaves_one_without_times_empty() {
        let empty = Panel {
            title: "nothing".into(),
            lines: vec![line(
                "no time",
                &[(1.0, f64::NAN)],
                Colour::Palette(1),
                Stroke::Measured,
            )],
        };
        let panels = [three_lines("first"), empty, three_lines("second")];
        let svg = render_grid("the title", &panels).expect("drawn");
        assert_svg_holds(&svg, &["the title", "first", "second", "measured", X_LABEL]);
        // Three panels a row; the empty one gets neither caption nor legend.
        assert!(svg.contains(r#"width="1680" height="520""#), "{svg}");
        assert!(
            !svg.contains("nothing") && !svg.contains("no time"),
            "{svg}"
        );
    }

    #[test]
    fn panels_without_times_are_an_error() {
        let mut panel = three_lines("t");
        for line in &mut panel.lines {
            for p in &mut line.points {
                p.1 = 0.0;
            }
        }
        assert_eq!(render_chart(&panel), Err(PlotError::NoTimes));
        assert_eq!(render_grid("t", &[panel]), Err(PlotError::NoTimes));
        assert_eq!(render_grid("t", &[]), Err(PlotError::NoTimes));
    }
}
