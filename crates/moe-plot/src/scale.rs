//! The log axes' ranges and tick labels.

/// The span of positive, finite values, widened by the factor `widen` on both ends so that no
/// point sits on the frame (and a single value still spans a range).
pub(crate) fn span(values: impl Iterator<Item = f64>, widen: f64) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (hi > 0.0).then_some((lo / widen, hi * widen))
}

/// A tick label: whole numbers from 100, otherwise up to three decimals without trailing
/// zeros (`0.01`, `2.5`), and powers of ten below a thousandth.
pub(crate) fn tick(v: f64) -> String {
    if v >= 100.0 {
        return format!("{v:.0}");
    }
    if v < 1e-3 {
        return format!("{v:.0e}");
    }
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_plain_numbers() {
        let ticks: Vec<String> = [0.01, 0.1, 2.5, 10.0, 1024.0, 1e-4].map(tick).to_vec();
        assert_eq!(ticks, ["0.01", "0.1", "2.5", "10", "1024", "1e-4"]);
    }

    #[test]
    fn spans_skip_what_a_log_axis_cannot_show_and_widen() {
        let values = [f64::NAN, 0.0, -1.0, 2.0, f64::INFINITY, 8.0];
        assert_eq!(span(values.into_iter(), 2.0), Some((1.0, 16.0)));
        assert_eq!(span([4.0].into_iter(), 2.0), Some((2.0, 8.0)));
        assert_eq!(span([0.0, f64::NAN].into_iter(), 2.0), None);
    }
}
