//! Draws TTFT CDFs (hedging off vs on) as an SVG with plotters.

use std::path::Path;

use plotters::prelude::*;

pub fn ttft_cdf(path: &Path, scenario: &str, off: &[f64], on: &[f64]) -> Result<(), String> {
    let max_ms = off.iter().chain(on).copied().fold(1.0_f64, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("TTFT CDF, scenario {scenario}"), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((1.0_f64..max_ms * 1.1).log_scale(), 0.0_f64..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("time to first token (ms, log scale)")
        .y_desc("share of requests")
        .draw()
        .map_err(|e| e.to_string())?;
    for (data, label, color) in [(off, "hedging off", RED), (on, "hedging on", BLUE)] {
        let n = data.len().max(1) as f64;
        let points = data.iter().enumerate().map(|(i, ms)| (ms.max(1.0), (i + 1) as f64 / n));
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
