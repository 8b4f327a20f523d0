//! What a chart is made of: named lines of `(M, ms)` points, grouped in titled panels.

/// The x axis' label.
pub const X_LABEL: &str = "M (tokens per call)";
/// The y axis' label.
pub const Y_LABEL: &str = "ms per call";

/// One line of a panel: `(M, ms)` points in the order they are joined.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Its name in the legend.
    pub name: String,
    /// `(tokens per call, ms per call)`; points that are not positive and finite are left out
    /// when drawing (log axes).
    pub points: Vec<(f64, f64)>,
    /// Its colour.
    pub colour: Colour,
    /// How it is stroked, which says what it shows.
    pub stroke: Stroke,
}

/// The colour of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    /// The given entry of a ten-colour palette legible on white (wrapping around), so that a
    /// caller matches colours by index: a bound in its measurement's colour, one side in the
    /// same colour in every panel.
    Palette(usize),
    /// Black, for a line that belongs to no measurement in particular.
    Black,
}

/// How a line is stroked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stroke {
    /// A measurement: solid, thick, with its points marked.
    Measured,
    /// A bound (the DRAM bound): dashed, thin.
    Dashed,
    /// A second kind of bound (the compute bound): dotted, thin.
    Dotted,
}

/// A titled set of lines on shared log axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The caption.
    pub title: String,
    /// The lines, drawn and listed in the legend in this order.
    pub lines: Vec<Line>,
}
