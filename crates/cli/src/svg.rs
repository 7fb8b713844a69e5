//! `--svg`: a hand-written SVG timeline of the whole replay. The grey area is
//! the workload's live bytes (the lower bound's curve); one line per
//! strategy shows what it reserved after every event; dashed verticals mark
//! where runs start. No plotting dependency.

use std::fmt::Write as _;

use crate::replay::StrategyResult;
use crate::workload::{live_curve, Workload};

/// Canvas size and plot margins, in px.
const WIDTH: f64 = 1100.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 112.0;
const BOTTOM: f64 = 52.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Line colour and dash of each strategy.
fn style(name: &str) -> (&'static str, &'static str) {
    match name {
        "arena" => ("#1f5fa8", ""),
        "planned" => ("#17becf", "7 4"),
        "system" => ("#e8710a", ""),
        "mimalloc" => ("#2ca02c", ""),
        "jemalloc" => ("#9467bd", ""),
        "bump" => ("#d62728", ""),
        _ => ("#333333", "2 2"),
    }
}

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A step of 1, 2 or 5 times a power of ten giving about six ticks up to
/// `max`.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 6.0).max(1e-9);
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * pow)
}

/// Keeps, per pixel column, the first, lowest, highest and last point, so
/// that peaks survive downsampling.
fn downsample(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let col = points[i].0.floor();
        let mut j = i;
        while j < points.len() && points[j].0.floor() == col {
            j += 1;
        }
        let group = &points[i..j];
        let lo = (0..group.len()).min_by(|&a, &b| group[a].1.total_cmp(&group[b].1));
        let hi = (0..group.len()).max_by(|&a, &b| group[a].1.total_cmp(&group[b].1));
        let mut keep: Vec<usize> = [Some(0), lo, hi, Some(group.len() - 1)]
            .into_iter()
            .flatten()
            .collect();
        keep.sort_unstable();
        keep.dedup();
        out.extend(keep.into_iter().map(|k| group[k]));
        i = j;
    }
    out
}

/// The SVG document for `results` replaying `workload`; `subtitle` says how.
pub fn timeline(workload: &Workload, results: &[StrategyResult], subtitle: &str) -> String {
    let total = workload.events().max(1) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let px = |x: f64| LEFT + x / total * plot_w;

    // The live curve, from the workload itself.
    let mut live = vec![(0.0, 0.0)];
    let mut run_starts = Vec::new();
    let mut x = 0u64;
    for run in &workload.runs {
        run_starts.push((x, run.label.as_str()));
        for bytes in live_curve(&run.events) {
            x += 1;
            live.push((x as f64, bytes as f64));
        }
    }
    let series: Vec<(&StrategyResult, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            let pts = std::iter::once((0.0, 0.0))
                .chain(
                    r.timeline
                        .samples
                        .iter()
                        .filter_map(|&(x, _, res)| Some((x as f64, res? as f64))),
                )
                .collect();
            (r, pts)
        })
        .collect();

    // Scale: fit everything, unless one series dwarfs the rest (bump, which
    // never reuses memory); then fit the rest and mark it off scale.
    let peak = |pts: &[(f64, f64)]| pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let live_peak = peak(&live);
    let mut peaks: Vec<f64> = series.iter().map(|(_, p)| peak(p)).collect();
    peaks.push(live_peak);
    peaks.sort_by(|a, b| b.total_cmp(a));
    let mut y_max = peaks.first().copied().unwrap_or(1.0).max(1.0);
    if peaks.len() > 1 && peaks[0] > 3.0 * peaks[1] {
        y_max = peaks[1].max(1.0);
    }
    let y_max_mib = y_max * 1.08 / MIB;
    let step = tick_step(y_max_mib);
    let y_top = (y_max_mib / step).ceil() * step;
    let py = |bytes: f64| TOP + plot_h - (bytes / MIB / y_top) * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="17" font-weight="bold">tensor-arena replay: bytes reserved by each strategy vs bytes live</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="44" font-size="12" fill="#444">{}</text>"##,
        esc(subtitle)
    );
    let _ = writeln!(
        s,
        r#"<defs><clipPath id="plot"><rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/></clipPath></defs>"#
    );

    // Grid and y axis.
    let mut tick = 0.0;
    while tick <= y_top + step * 1e-6 {
        let y = py(tick * MIB);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="#333">{}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            y + 4.0,
            fmt_tick(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        s,
        r##"<text transform="translate(22 {:.1}) rotate(-90)" font-size="13" text-anchor="middle" fill="#333">MiB</text>"##,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" fill="#333">allocation events, whole replay (runs in order)</text>"##,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0
    );

    // Live bytes: a filled area.
    let mut area = format!("M{:.1},{:.1}", px(0.0), py(0.0));
    for (x, b) in downsample(&scale(&live, px, py)) {
        let _ = write!(area, " L{x:.1},{b:.1}");
    }
    let _ = write!(area, " L{:.1},{:.1} Z", px(total), py(0.0));
    let _ = writeln!(
        s,
        r##"<path d="{area}" fill="#cfcfcf" stroke="#a8a8a8" stroke-width="0.5" clip-path="url(#plot)"/>"##
    );

    // Run boundaries and labels.
    for (i, &(start, label)) in run_starts.iter().enumerate() {
        let x = px(start as f64);
        let next = run_starts.get(i + 1).map_or(total, |&(n, _)| n as f64);
        let room = px(next) - x;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="4 3"/>"##,
            TOP - 14.0,
            TOP + plot_h
        );
        let text = format!("{i}: {label}");
        let full = text.chars().count() as f64 * 6.6 + 8.0 <= room;
        let shown = if full { text } else { i.to_string() };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
            x + 4.0,
            TOP - 4.0,
            esc(&shown)
        );
    }

    // One line per strategy.
    for (r, pts) in &series {
        let (color, dash) = style(&r.name);
        // Values above the scale run along the top edge.
        let pinned = |b: f64| py(b).max(TOP + 1.0);
        let mut d = String::new();
        for (k, (x, y)) in downsample(&scale(pts, px, pinned)).into_iter().enumerate() {
            let _ = write!(d, "{}{x:.1},{y:.1}", if k == 0 { "M" } else { " L" });
        }
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dash} stroke-linejoin="round" clip-path="url(#plot)"/>"#
        );
    }

    // Plot frame.
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#666"/>"##
    );

    // Legend under the title: the live area, then one entry per strategy
    // (wrapping to a second row if needed).
    let mut lx = LEFT;
    let mut ly = 68.0;
    let live_label = format!("live bytes (peak = max lower bound, {})", mib(live_peak));
    let _ = writeln!(
        s,
        r##"<rect x="{lx}" y="{:.1}" width="18" height="10" fill="#cfcfcf" stroke="#a8a8a8"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"##,
        ly - 9.0,
        lx + 24.0,
        ly,
        esc(&live_label)
    );
    lx += 24.0 + text_width(&live_label) + 18.0;
    let _ = writeln!(
        s,
        r##"<text x="{lx:.1}" y="{ly:.1}" font-size="12" fill="#333">reserved by:</text>"##
    );
    lx += text_width("reserved by:") + 10.0;
    for (r, pts) in &series {
        let (color, dash) = style(&r.name);
        let p = peak(pts);
        let label = if p > y_top * MIB {
            format!(
                "{} (off scale: up to {}, drawn along the top)",
                r.name,
                mib(p)
            )
        } else {
            r.name.clone()
        };
        let w = 25.0 + text_width(&label) + 16.0;
        if lx + w > WIDTH - RIGHT {
            lx = LEFT;
            ly += 18.0;
        }
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="{ly:.1}" font-size="12">{}</text>"#,
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            lx + 25.0,
            esc(&label)
        );
        lx += w;
    }
    s.push_str("</svg>\n");
    s
}

/// Rough width of `text` at 12 px.
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * 6.8
}

/// Points in data space to pixels.
fn scale(pts: &[(f64, f64)], px: impl Fn(f64) -> f64, py: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
    pts.iter().map(|&(x, y)| (px(x), py(y))).collect()
}

/// `bytes` as MiB for a legend.
fn mib(bytes: f64) -> String {
    if bytes >= 1024.0 * MIB {
        format!("{:.2} GiB", bytes / MIB / 1024.0)
    } else {
        format!("{:.1} MiB", bytes / MIB)
    }
}

/// A tick label: as many decimals as the step needs.
fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-step.log10().floor()) as usize;
        format!("{v:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0), 20.0);
        assert_eq!(tick_step(6.0), 1.0);
        assert_eq!(tick_step(0.3), 0.05);
        assert_eq!(fmt_tick(0.15, 0.05), "0.15");
    }

    #[test]
    fn downsample_keeps_extremes() {
        let pts = [(0.1, 5.0), (0.2, 1.0), (0.3, 9.0), (0.4, 3.0), (1.5, 2.0)];
        assert_eq!(
            downsample(&pts),
            vec![(0.1, 5.0), (0.2, 1.0), (0.3, 9.0), (0.4, 3.0), (1.5, 2.0)]
        );
        let pts = [(0.1, 5.0), (0.2, 1.0), (0.25, 4.0), (0.3, 9.0), (0.4, 3.0)];
        assert_eq!(downsample(&pts).len(), 4);
    }
}
