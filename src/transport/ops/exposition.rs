//! Reading the Prometheus exposition text back into series, for the rotation view.
//!
//! The recorder is the one store of the rotation metrics and the exporter offers no
//! structured read (its protobuf output needs a protobuf toolchain at build time), so the
//! text it renders is parsed here: one `name{labels} value` per line, label values escaped
//! as the exposition format says (`\\`, `\"`, `\n`). Only the rotation series are kept.

use std::collections::BTreeMap;

use crate::telemetry::rotation as rt;

/// One series of the exposition: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Series {
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// The rotation series of an exposition text (other metrics, comments and lines that do not
/// parse are skipped).
pub fn parse(text: &str) -> Vec<Series> {
    text.lines()
        .filter(|line| line.starts_with("tailcut_") && is_rotation(line))
        .filter_map(parse_line)
        .collect()
}

const ROTATION: [&str; 11] = [
    rt::LOGICAL_REQUESTS_TOTAL,
    rt::ANSWERS_TOTAL,
    rt::MODEL_COST_TOTAL,
    rt::FAILOVERS_TOTAL,
    rt::ATTEMPTS_PER_REQUEST,
    rt::ROUTE_CHANGES_TOTAL,
    rt::UNROUTABLE_TOTAL,
    rt::RECOVERY_SECONDS,
    rt::ANSWER_COST_TOTAL,
    rt::POLICY_REJECTIONS_TOTAL,
    rt::REPAIRS_TOTAL,
];

fn is_rotation(line: &str) -> bool {
    ROTATION.iter().any(|name| line.starts_with(name))
}

/// `name{k="v",...} value` or `name value`.
fn parse_line(line: &str) -> Option<Series> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Series { name, labels, value })
}

/// The labels after `{`, up to and past the closing `}`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches(',');
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].to_string();
        let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key, value);
        s = &s[eq + 2 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tailcut_failovers_total Moves
# TYPE tailcut_failovers_total counter
tailcut_failovers_total{from="a",to="b",layer="provider_switch",result="served"} 3
tailcut_requests_total{model="chat"} 10
tailcut_route_changes_total{model="odd \"quoted\\ name"} 1
"#;

    #[test]
    fn exposition_lines_parse_with_escaped_labels() {
        let series = parse(TEXT);
        assert!(
            series.iter().all(|s| s.name != "tailcut_requests_total"),
            "only the rotation series are kept"
        );
        let odd = series
            .iter()
            .find(|s| s.name == rt::ROUTE_CHANGES_TOTAL)
            .expect("the escaped line parses");
        assert_eq!(odd.label("model"), "odd \"quoted\\ name");
        assert_eq!(odd.value, 1.0);
        assert_eq!(parse_line("tailcut_x{a=\"1\"} nope"), None, "a bad value is skipped");
        assert_eq!(parse_line("tailcut_x{a=\"1} 3"), None, "an unclosed label is skipped");
    }
}
