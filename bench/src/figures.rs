//! Figures and how they are written: nearest-rank percentiles, progress bars on long phases,
//! and the JSON report each mode leaves in its output folder.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

/// Percentiles of a sample, nearest rank, in the sample's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut sample: Vec<f64>) -> Option<Spread> {
        if sample.is_empty() {
            return None;
        }
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| sample[((sample.len() as f64 * q).ceil() as usize).clamp(1, sample.len()) - 1];
        Some(Spread {
            n: sample.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

/// A progress bar on stderr for `len` steps (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {elapsed}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Writes `report` as pretty JSON to `out/name`.
pub fn write_json(out: &Path, name: &str, report: &impl Serialize) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let path = out.join(name);
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The machine a run was on, for the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub unix_time: u64,
}

impl Machine {
    pub fn now() -> Machine {
        Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = Spread::of((1..=100).rev().map(f64::from).collect()).expect("samples");
        assert_eq!((s.n, s.p50, s.p90, s.p99, s.max), (100, 50.0, 90.0, 99.0, 100.0));
        assert!(Spread::of(Vec::new()).is_none(), "no samples is no figure, not a zero");
    }

    #[test]
    fn a_written_report_parses_back() {
        let dir = std::env::temp_dir().join(format!("tailcut-bench-test-{}", std::process::id()));
        let spread = Spread::of(vec![1.0, 2.0, 3.0]).expect("samples");
        write_json(
            &dir,
            "t.json",
            &serde_json::json!({ "gap_us": spread, "machine": Machine::now() }),
        )
        .expect("written");
        let text = std::fs::read_to_string(dir.join("t.json")).expect("readable");
        let back: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let parsed: Spread = serde_json::from_value(back["gap_us"].clone()).expect("a Spread");
        assert_eq!(parsed, spread);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
