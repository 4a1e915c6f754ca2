//! What the benchmarks with named parts (P11, P12) share: which parts to run, and the
//! figures they report.

/// Whether the part `name` runs: every part when none is named on the command line
/// (`cargo bench --bench X -- drain latency`), else only those named.
pub fn wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    args.is_empty() || args.iter().any(|a| a == name)
}

/// Median, minimum and maximum of the runs' figures.
pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The `p` (0..=1) percentile of figures sorted ascending.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
