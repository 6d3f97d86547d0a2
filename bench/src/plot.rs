//! Draws TTFT CCDFs (hedging off vs on) as an SVG with plotters: the share of requests slower
//! than each TTFT, on a log y axis, so the tail the percentiles talk about is visible.

use std::path::Path;

use plotters::prelude::*;

/// `off` and `on` are TTFTs in ms, sorted ascending.
pub fn ttft_ccdf(path: &Path, scenario: &str, off: &[f64], on: &[f64]) -> Result<(), String> {
    let max_ms = off.iter().chain(on).copied().fold(1.0_f64, f64::max);
    let n_max = off.len().max(on.len()).max(1) as f64;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("TTFT CCDF, scenario {scenario}"), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1.0_f64..max_ms * 1.1).log_scale(), (0.5 / n_max..1.0_f64).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("time to first token (ms, log scale)")
        .y_desc("share of requests slower (log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    for (data, label, color) in [(off, "hedging off", RED), (on, "hedging on", BLUE)] {
        let points = ccdf(data);
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// (TTFT, share of requests at or slower than it) for sorted TTFTs: from 1 down to 1/n.
fn ccdf(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len().max(1) as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, ms)| (ms.max(1.0), (sorted.len() - i) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ccdf_falls_from_one_to_one_over_n() {
        let points = super::ccdf(&[1.0, 2.0, 4.0, 8.0]);
        let shares: Vec<f64> = points.iter().map(|p| p.1).collect();
        assert_eq!(
            shares,
            vec![1.0, 0.75, 0.5, 0.25],
            "never zero, so a log axis can show it"
        );
    }
}
