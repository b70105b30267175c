//! Percentiles (hdrhistogram), scenario results, the printed table and `results.json`.

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Map, Value};

/// Whether bigger numbers are better (throughput) or worse (latency, memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Latency, memory: the tail (p90, p99) is the high end.
    Lower,
    /// Throughput: the tail (p90, p99) is the low end, so that "p99" is still the value 99 % of
    /// the samples are at least as good as.
    Higher,
}

/// Percentiles of one side of one scenario.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Dist {
    /// Median.
    pub p50: f64,
    /// 90th percentile (in the "worse" direction).
    pub p90: f64,
    /// 99th percentile (in the "worse" direction).
    pub p99: f64,
    /// Number of samples.
    pub n: u64,
}

/// Values are recorded in thousandths of the unit (3 significant digits kept by the histogram).
const SCALE: f64 = 1000.0;

impl Dist {
    /// Percentiles of `samples`; None when there are none.
    pub fn of(samples: &[f64], better: Better) -> Option<Dist> {
        if samples.is_empty() {
            return None;
        }
        let mut h = Histogram::<u64>::new(3).expect("3 significant digits is valid");
        for &s in samples {
            let v = (s.max(0.0) * SCALE).round() as u64;
            h.record(v.max(1)).expect("auto-resizing histogram");
        }
        let q = |p: f64| {
            let p = match better {
                Better::Lower => p,
                // Rounded: 1.0 - 0.99 is 0.010000000000000009, one sample too many.
                Better::Higher => ((1.0 - p) * 1e6).round() / 1e6,
            };
            h.value_at_quantile(p) as f64 / SCALE
        };
        Some(Dist {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            n: samples.len() as u64,
        })
    }

    /// A single measured value (density): every percentile is that value.
    pub fn single(v: f64) -> Dist {
        Dist {
            p50: v,
            p90: v,
            p99: v,
            n: 1,
        }
    }
}

/// One scenario's outcome on one side.
#[derive(Debug, Default)]
pub struct Side {
    /// The percentiles, None when not measured (n/a or failed).
    pub dist: Option<Dist>,
    /// Extra fields for results.json, prefixed with `ours_` / `baseline_` when written.
    pub extra: Map<String, Value>,
    /// Why it has no numbers (error or n/a).
    pub error: Option<String>,
}

impl Side {
    /// A side with numbers.
    pub fn measured(dist: Option<Dist>) -> Side {
        Side {
            dist,
            ..Default::default()
        }
    }

    /// Adds an extra field.
    pub fn with(mut self, key: &str, v: impl Into<Value>) -> Side {
        self.extra.insert(key.to_string(), v.into());
        self
    }

    /// A side that failed.
    pub fn failed(e: &anyhow::Error) -> Side {
        Side {
            error: Some(format!("{e:#}")),
            ..Default::default()
        }
    }
}

/// One scenario, both sides.
#[derive(Debug)]
pub struct Scenario {
    /// Scenario name.
    pub name: &'static str,
    /// Unit of p50/p90/p99.
    pub unit: &'static str,
    /// Direction.
    pub better: Better,
    /// Through the daemon.
    pub ours: Side,
    /// Raw containerd + runsc.
    pub baseline: Side,
    /// Free-form notes.
    pub notes: Vec<String>,
}

fn round3(v: f64) -> Value {
    serde_json::Number::from_f64((v * 1000.0).round() / 1000.0)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn opt(v: Option<f64>) -> Value {
    v.map(round3).unwrap_or(Value::Null)
}

impl Scenario {
    /// ours p50 / baseline p50.
    pub fn ratio(&self) -> Option<f64> {
        match (self.ours.dist, self.baseline.dist) {
            (Some(o), Some(b)) if o.p50 > 0.0 && b.p50 > 0.0 => Some(o.p50 / b.p50),
            _ => None,
        }
    }

    /// The results.json object.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), self.name.into());
        m.insert("unit".into(), self.unit.into());
        m.insert(
            "better".into(),
            match self.better {
                Better::Lower => "lower",
                Better::Higher => "higher",
            }
            .into(),
        );
        for (prefix, side) in [("ours", &self.ours), ("baseline", &self.baseline)] {
            let d = side.dist;
            m.insert(format!("{prefix}_p50"), opt(d.map(|d| d.p50)));
            m.insert(format!("{prefix}_p90"), opt(d.map(|d| d.p90)));
            m.insert(format!("{prefix}_p99"), opt(d.map(|d| d.p99)));
            m.insert(
                format!("{prefix}_n"),
                d.map(|d| Value::from(d.n)).unwrap_or(Value::Null),
            );
            if let Some(e) = &side.error {
                m.insert(format!("{prefix}_error"), e.clone().into());
            }
            for (k, v) in &side.extra {
                let v = match v {
                    Value::Number(n) if n.is_f64() => round3(n.as_f64().unwrap_or_default()),
                    v => v.clone(),
                };
                m.insert(format!("{prefix}_{k}"), v);
            }
        }
        m.insert("ratio_p50".into(), opt(self.ratio()));
        m.insert(
            "n".into(),
            self.ours
                .dist
                .or(self.baseline.dist)
                .map(|d| Value::from(d.n))
                .unwrap_or(Value::Null),
        );
        m.insert("notes".into(), self.notes.join("; ").into());
        Value::Object(m)
    }
}

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// The rows of the table: header first.
fn rows(scenarios: &[Scenario]) -> Vec<Vec<String>> {
    let mut out = vec![[
        "scenario",
        "unit",
        "n",
        "ours p50",
        "ours p90",
        "ours p99",
        "base p50",
        "base p90",
        "base p99",
        "ours/base p50",
    ]
    .map(String::from)
    .to_vec()];
    for s in scenarios {
        let o = s.ours.dist;
        let b = s.baseline.dist;
        let n = match (o, b) {
            (Some(o), Some(b)) if o.n != b.n => format!("{}/{}", o.n, b.n),
            (Some(d), _) | (None, Some(d)) => d.n.to_string(),
            _ => "-".into(),
        };
        out.push(vec![
            s.name.to_string(),
            s.unit.to_string(),
            n,
            fmt(o.map(|d| d.p50)),
            fmt(o.map(|d| d.p90)),
            fmt(o.map(|d| d.p99)),
            fmt(b.map(|d| d.p50)),
            fmt(b.map(|d| d.p90)),
            fmt(b.map(|d| d.p99)),
            s.ratio()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        ]);
    }
    out
}

/// The table as aligned plain text.
pub fn text_table(scenarios: &[Scenario]) -> String {
    let rows = rows(scenarios);
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c < 2 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// The table as Markdown.
pub fn markdown_table(scenarios: &[Scenario]) -> String {
    let rows = rows(scenarios);
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        out.push_str("| ");
        out.push_str(&r.join(" | "));
        out.push_str(" |\n");
        if i == 0 {
            out.push('|');
            for c in 0..r.len() {
                out.push_str(if c < 2 { " --- |" } else { " ---: |" });
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_direction() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        let lo = Dist::of(&s, Better::Lower).unwrap();
        assert!((lo.p50 - 50.0).abs() < 0.1 && (lo.p99 - 99.0).abs() < 0.1);
        let hi = Dist::of(&s, Better::Higher).unwrap();
        assert!((hi.p50 - 50.0).abs() < 0.1, "{hi:?}");
        assert!(
            (hi.p90 - 10.0).abs() < 0.1 && (hi.p99 - 1.0).abs() < 0.1,
            "{hi:?}"
        );
        assert!(Dist::of(&[], Better::Lower).is_none());
    }
}
