//! SVG charts of benchmark times: milliseconds per call against tokens per call (M), both axes
//! logarithmic, measured lines solid with points and bounds dashed or dotted.
//!
//! `moe bench --plot` and `cargo xtask bench-peers --plot` draw the same kind of chart from
//! different reports. Each builds its [`Panel`]s (lines, colours, titles) and hands them to
//! [`render_chart`] (one large chart) or [`render_grid`] (one panel per shape under a common
//! title); the axes, ticks, line styles and legend are drawn here only, so the two charts read
//! alike.

#![forbid(unsafe_code)]

mod chart;
mod error;
mod render;
mod scale;

pub use chart::{Colour, Line, Panel, Stroke, X_LABEL, Y_LABEL};
pub use error::PlotError;
pub use render::{render_chart, render_grid};
