//! What the benchmarks share: which parts to run (the benches with named parts, P11,
//! P12), and how their figures are summed up.

/// Whether the part `name` runs: every part when none is named on the command line
/// (`cargo bench --bench X -- drain latency`), else only those named.
pub fn wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    args.is_empty() || args.iter().any(|a| a == name)
}

/// A count from the environment (`FLOTILLA_BENCH_*`), else `default`. (Not every bench
/// that includes this file reads one.)
#[allow(dead_code)]
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs per measurement: `FLOTILLA_BENCH_RUNS`, else the bench's `default`; at least one.
#[allow(dead_code)]
pub fn runs(default: usize) -> usize {
    env_usize("FLOTILLA_BENCH_RUNS", default).max(1)
}

/// The benchmarks' one definition of their figures. Every sample is kept (at most some
/// 10^5 a run) and sorted once, so percentiles are exact; a recording histogram
/// (hdrhistogram) would trade that for bounded memory, which a bench of minutes does not
/// need.
///
/// Figures sorted ascending (NaN, which no bench produces, sorts last).
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `p` (0..=1) percentile of figures sorted ascending: the nearest rank, rounded;
/// NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (p * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Median (the 0.5 percentile, as above), minimum and maximum of the runs' figures; NaN
/// for none.
pub fn median(v: &[f64]) -> (f64, f64, f64) {
    let s = sorted(v.to_vec());
    (
        percentile(&s, 0.5),
        s.first().copied().unwrap_or(f64::NAN),
        s.last().copied().unwrap_or(f64::NAN),
    )
}

/// `median (min–max)`, with `digits` decimals.
pub fn spread(v: &[f64], digits: usize) -> String {
    let (m, lo, hi) = median(v);
    if (hi - lo).abs() < f64::EPSILON {
        format!("{m:.digits$}")
    } else {
        format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
    }
}

/// The machine's load averages (1, 5, 15 min), as /proc/loadavg has them: what else
/// was running beside a bench.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
