//! Why a chart could not be drawn.

use std::fmt;

/// Why a chart could not be drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlotError {
    /// No point has a positive, finite M and time, so log axes have no range.
    NoTimes,
    /// plotters failed while drawing (the message is its error's).
    Draw(String),
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlotError::NoTimes => f.write_str("no positive times to plot"),
            PlotError::Draw(e) => write!(f, "drawing the chart: {e}"),
        }
    }
}

impl std::error::Error for PlotError {}
