//! `/status.html`: this worker's supervision tree ([`crate::status_tree`]) and the last
//! 10 minutes of each shard ([`crate::status_history`]), drawn on the server as one
//! self-contained HTML page: inline CSS and inline SVG charts, no script, no external
//! asset. It reloads itself every [`crate::status_history::STEP`] (a meta refresh), the
//! step of the charts.
//!
//! Every piece of data goes through `escape`: an error message or a stream name that
//! looks like markup stays text.

use std::fmt::Write as _;

use crate::status::WorkerStatus;
use crate::status_history::{POINTS, Point, STEP, Series};
use crate::status_tree::{NodeKind, TreeNode, tree};

/// Chart size in CSS pixels: one step every 4 px.
const CHART_W: usize = 240;
const CHART_H: usize = 36;

/// The whole page: a header, the shards not processed (first, so they stand out), the
/// tree with each reader's charts beside it.
pub fn render(status: &WorkerStatus, charts: &[Series]) -> String {
    let root = tree(status);
    let mut out = String::with_capacity(4096 + 1024 * status.shards.len());
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"refresh\" content=\"{}\">\n<title>flotilla worker {}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n",
        STEP.as_secs(),
        escape(&status.worker_id)
    );
    let _ = write!(
        out,
        "<h1>flotilla worker <span id=\"worker\">{}</span></h1>\n<div id=\"summary\">\
         application <b>{}</b>, stream <b>{}</b> ({}, {}), <b class=\"wstate\">{}</b>, up {}, \
         {} shards, {} shard restarts. <a href=\"fleet.html\">the fleet</a> · \
         <a href=\"status\">JSON</a></div>\n",
        escape(&status.worker_id),
        escape(&status.application),
        escape(&status.stream),
        escape(status.source),
        escape(status.read_mode),
        escape(status.state),
        crate::status_tree::duration(status.uptime_ms),
        status.shards.len(),
        status.shard_restarts,
    );
    let stalled: Vec<&TreeNode> = root
        .walk()
        .into_iter()
        .map(|(_, n)| n)
        .filter(|n| n.stall.is_some())
        .collect();
    if !stalled.is_empty() {
        let _ = write!(
            out,
            "<div id=\"stalls\" role=\"alert\"><b>{} not processed:</b><ul>",
            stalled.len()
        );
        for node in stalled {
            let _ = write!(
                out,
                "<li><b>{}</b>: {}</li>",
                escape(&node.name),
                escape(node.stall.as_deref().unwrap_or_default())
            );
        }
        out.push_str("</ul></div>\n");
    }
    let _ = write!(
        out,
        "<h2>Supervision tree <small>(charts: the last {} minutes, one point per {} s; \
         a break is a step with no sample)</small></h2>\n<ul id=\"tree\" class=\"tree\">",
        STEP.as_secs() * POINTS as u64 / 60,
        STEP.as_secs()
    );
    node_html(&mut out, &root, charts);
    out.push_str("</ul>\n</body>\n</html>\n");
    out
}

fn node_html(out: &mut String, node: &TreeNode, charts: &[Series]) {
    let kind = match node.kind {
        NodeKind::Supervisor => "supervisor",
        NodeKind::Core => "core",
        NodeKind::Reader => "reader",
        NodeKind::Processor => "processor",
    };
    let stalled = if node.stall.is_some() { " stalled" } else { "" };
    let _ = write!(
        out,
        "<li class=\"node {kind}{stalled}\"><div class=\"line\"><span class=\"name\">{}</span> \
         <span class=\"state s-{}\">{}</span>",
        escape(&node.name),
        escape(&node.state),
        escape(&node.state)
    );
    if let Some(restarts) = node.restarts {
        let _ = write!(
            out,
            " <span class=\"fact\">restarts <b>{restarts}</b></span>"
        );
    }
    for (label, value) in &node.facts {
        let _ = write!(
            out,
            " <span class=\"fact\">{} <b>{}</b></span>",
            escape(label),
            escape(value)
        );
    }
    out.push_str("</div>");
    if let Some(why) = &node.stall {
        let _ = write!(
            out,
            "<div class=\"stall\">not processed: {}</div>",
            escape(why)
        );
    }
    if let Some(error) = &node.last_error {
        let _ = write!(out, "<div class=\"error\">last error: {}", escape(error));
        if let Some(ms) = node.error_age_ms {
            let _ = write!(out, " ({} ago)", crate::status_tree::duration(ms));
        }
        out.push_str("</div>");
    }
    if let Some(series) = node
        .shard
        .as_deref()
        .and_then(|shard| charts.iter().find(|s| s.name == shard))
    {
        out.push_str("<div class=\"charts\">");
        chart(out, "records/s", &series.points, |p| {
            Some(f64::from(p.records_per_second))
        });
        chart(out, "lag ms", &series.points, |p| p.lag_ms.map(f64::from));
        out.push_str("</div>");
    }
    if !node.children.is_empty() {
        out.push_str("<ul>");
        for child in &node.children {
            node_html(out, child, charts);
        }
        out.push_str("</ul>");
    }
    out.push_str("</li>");
}

/// One inline SVG line chart of `value` over the window, scaled to its largest value;
/// a step without a value breaks the line (a lone value is a dot).
pub(crate) fn chart(
    out: &mut String,
    label: &str,
    points: &[Option<Point>],
    value: impl Fn(&Point) -> Option<f64>,
) {
    let values: Vec<Option<f64>> = points.iter().map(|p| p.as_ref().and_then(&value)).collect();
    let max = values.iter().flatten().copied().fold(0.0_f64, f64::max);
    let last = values.iter().rev().flatten().next().copied();
    let scale = if max > 0.0 { max } else { 1.0 };
    let step = CHART_W as f64 / (POINTS.max(2) - 1) as f64;
    let xy = |i: usize, v: f64| {
        let x = i as f64 * step;
        let y = CHART_H as f64 - 2.0 - v / scale * (CHART_H as f64 - 4.0);
        (x, y)
    };
    let _ = write!(
        out,
        "<figure class=\"chart\" data-label=\"{}\" data-points=\"{}\"><svg width=\"{CHART_W}\" \
         height=\"{CHART_H}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" role=\"img\"><title>{}: now {}, \
         max {}</title><rect width=\"{CHART_W}\" height=\"{CHART_H}\" class=\"bg\"/>",
        escape(label),
        values.iter().flatten().count(),
        escape(label),
        number(last),
        number(Some(max)),
    );
    let mut segment: Vec<(f64, f64)> = Vec::new();
    let flush = |segment: &mut Vec<(f64, f64)>, out: &mut String| {
        match segment.as_slice() {
            [] => {}
            [(x, y)] => {
                let _ = write!(out, "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"1.6\"/>");
            }
            many => {
                out.push_str("<polyline points=\"");
                for (x, y) in many {
                    let _ = write!(out, "{x:.1},{y:.1} ");
                }
                out.push_str("\"/>");
            }
        }
        segment.clear();
    };
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => segment.push(xy(i, *v)),
            None => flush(&mut segment, out),
        }
    }
    flush(&mut segment, out);
    let _ = write!(
        out,
        "</svg><figcaption>{} <b>{}</b> <small>max {}</small></figcaption></figure>",
        escape(label),
        number(last),
        number(Some(max))
    );
}

fn number(v: Option<f64>) -> String {
    match v {
        None => "-".to_owned(),
        Some(v) if v >= 100.0 || v.fract() == 0.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

/// Text as HTML text or attribute value.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 1.5rem; color: #222; background: #fafafa; }
h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
h2 { font-size: 1.05rem; margin: 1.2rem 0 .4rem; }
h2 small, figcaption small { color: #777; font-weight: normal; }
#summary { color: #555; }
#stalls { background: #fde2e1; border: 1px solid #d93025; color: #8c1d18; padding: .5rem .8rem; margin: .6rem 0; }
#stalls ul { margin: .2rem 0; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 1.3rem; border-left: 1px solid #ccc; }
ul.tree { border-left: none; padding-left: 0; }
li.node { margin: .25rem 0; }
.line .name { font-family: ui-monospace, monospace; font-weight: 600; }
.fact { color: #555; margin-left: .5rem; font-size: 13px; }
.state { display: inline-block; padding: 0 .45rem; border-radius: .6rem; font-size: 12px; color: #fff; background: #2e8b57; margin-left: .3rem; }
.s-fenced, .s-stalled, .s-lease_lost, .s-restarting, .s-stopping { background: #b3261e; }
.s-throttled, .s-waiting_on_budget, .s-draining, .s-handing_off, .s-shard_ending, .s-finishing { background: #c77700; }
.s-blocked_on_parent, .s-initializing, .s-starting { background: #6a4fb3; }
.s-caught_up { background: #3b7dd8; }
li.stalled > .line { background: #fde2e1; outline: 1px solid #d93025; }
.stall { color: #8c1d18; font-weight: 600; margin-left: 1rem; }
.error { color: #8c1d18; margin-left: 1rem; font-size: 13px; }
.charts { display: flex; gap: 1.2rem; margin: .2rem 0 .2rem 1rem; }
figure.chart { margin: 0; font-size: 12px; color: #555; }
figure.chart svg { display: block; }
figure.chart rect.bg { fill: #fff; stroke: #ddd; }
figure.chart polyline { fill: none; stroke: #4a7bd0; stroke-width: 1.5; }
figure.chart circle { fill: #4a7bd0; }
figure.chart[data-label='lag ms'] polyline { stroke: #e08a1e; }
figure.chart[data-label='lag ms'] circle { fill: #e08a1e; }
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::ShardState;
    use crate::status_tree::tests::{shard, worker};

    fn series(name: &str, values: &[Option<f32>]) -> Series {
        let mut points = vec![None; POINTS - values.len()];
        points.extend(values.iter().map(|v| {
            v.map(|v| Point {
                records_per_second: v,
                lag_ms: Some(100),
            })
        }));
        Series {
            name: name.to_owned(),
            points,
        }
    }

    /// Every node of the tree is on the page, in the tree's order, a stalled shard
    /// listed first and marked, and each reader with its two charts.
    #[test]
    fn the_page_draws_the_tree_its_stalls_and_charts() {
        let mut revoked = shard("shardId-000000000002", ShardState::Fenced);
        revoked.fenced = Some(crate::FenceReason::Revoked {
            why: "<b>owner w-2</b>".to_owned(),
        });
        let status = worker(vec![
            shard("shardId-000000000001", ShardState::Processing),
            revoked,
        ]);
        let charts = [series(
            "shardId-000000000001",
            &[Some(1.0), None, Some(3.0), Some(2.0)],
        )];
        let page = render(&status, &charts);
        let mut at = 0;
        for (_, node) in tree(&status).walk() {
            let needle = format!("<span class=\"name\">{}</span>", node.name);
            let found = page[at..].find(&needle);
            assert!(found.is_some(), "{} missing or out of order", node.name);
            at += found.unwrap_or_default();
        }
        let stalls = page.find("id=\"stalls\"").unwrap_or(usize::MAX);
        assert!(
            stalls < page.find("id=\"tree\"").unwrap_or(0),
            "stalls first"
        );
        assert!(page.contains("<li class=\"node reader stalled\">"));
        assert!(
            page.contains("&lt;b&gt;owner w-2&lt;/b&gt;"),
            "markup stays text"
        );
        assert!(!page.contains("<b>owner w-2</b>"));
        assert_eq!(page.matches("<figure class=\"chart\"").count(), 2);
        assert!(page.contains("data-points=\"3\""), "three samples drawn");
    }

    /// A gap breaks the line: two samples then a gap then one are a polyline and a dot.
    #[test]
    fn a_gap_breaks_the_chart_line() {
        let s = series("s", &[Some(1.0), Some(2.0), None, Some(4.0)]);
        let mut out = String::new();
        chart(&mut out, "records/s", &s.points, |p| {
            Some(f64::from(p.records_per_second))
        });
        assert_eq!(out.matches("<polyline").count(), 1, "{out}");
        assert_eq!(out.matches("<circle").count(), 1, "{out}");
        assert!(out.contains("now 4, max 4"), "{out}");
        let mut empty = String::new();
        chart(&mut empty, "lag ms", &[None; POINTS], |p| {
            p.lag_ms.map(f64::from)
        });
        assert!(!empty.contains("<polyline") && !empty.contains("<circle"));
        assert!(empty.contains("now -"), "{empty}");
    }
}
