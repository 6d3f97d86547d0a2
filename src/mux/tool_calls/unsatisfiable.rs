//! Schemas no value can satisfy, told apart before any upstream is asked: `false`, `not` of
//! everything, an empty `enum`, or bounds that cross on the type the schema requires
//! (`minimum` over `maximum` on a number, `minLength` over `maxLength` on a string, ...),
//! at the root or in a required property.
//!
//! Why: every answer to such a schema is invalid output, so each route was asked, failed
//! over and counted against, and the client got a 502 after all of them (an SDK retrying 5xx
//! multiplied that). Only cases that are certain are caught: a bound applies only to its own
//! type, so `{"minimum": 5, "maximum": 1}` with no `type` (a string satisfies it) passes.

use serde_json::Value;

/// Required properties followed at most, so a deep schema costs a bounded walk.
const MAX_DEPTH: usize = 32;

/// Why `schema` admits no value, when that is certain.
pub fn why_unsatisfiable(schema: &Value) -> Option<String> {
    at(schema, "", 0)
}

fn at(schema: &Value, path: &str, depth: usize) -> Option<String> {
    let here = if path.is_empty() { "the schema" } else { path };
    let s = match schema {
        Value::Bool(false) => return Some(format!("{here} is `false`, which nothing satisfies")),
        Value::Object(s) => s,
        _ => return None,
    };
    if s.get("not")
        .is_some_and(|not| *not == Value::Bool(true) || not.as_object().is_some_and(|o| o.is_empty()))
    {
        return Some(format!("{here} is `not` of everything"));
    }
    if s.get("enum").and_then(Value::as_array).is_some_and(Vec::is_empty) {
        return Some(format!("{here} has an empty `enum`"));
    }
    let kind = s.get("type").and_then(Value::as_str);
    let crossed = |low: &str, high: &str| {
        let (lo, hi) = (
            s.get(low).and_then(Value::as_f64)?,
            s.get(high).and_then(Value::as_f64)?,
        );
        (lo > hi).then(|| format!("{here} has `{low}` {lo} over `{high}` {hi}"))
    };
    let bounds: &[(&str, &str)] = match kind {
        Some("number" | "integer") => &[("minimum", "maximum")],
        Some("string") => &[("minLength", "maxLength")],
        Some("array") => &[("minItems", "maxItems")],
        Some("object") => &[("minProperties", "maxProperties")],
        _ => &[],
    };
    if let Some(why) = bounds.iter().find_map(|(low, high)| crossed(low, high)) {
        return Some(why);
    }
    if depth >= MAX_DEPTH || kind.is_some_and(|k| k != "object") {
        return None;
    }
    let required = s.get("required").and_then(Value::as_array)?;
    let props = s.get("properties").and_then(Value::as_object)?;
    required.iter().filter_map(Value::as_str).find_map(|name| {
        let sub = props.get(name)?;
        at(sub, &format!("{here}'s required property {name:?}"), depth + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_nothing_satisfies_are_told_apart() {
        for schema in [
            json!(false),
            json!({"not": {}}),
            json!({"type": "object", "properties": {"unit": {"enum": []}}, "required": ["unit"]}),
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["n"]}),
            json!({"type": "string", "minLength": 9, "maxLength": 3}),
        ] {
            assert!(why_unsatisfiable(&schema).is_some(), "{schema}");
        }
    }

    #[test]
    fn schemas_something_satisfies_pass() {
        for schema in [
            json!({"type": "object"}),
            json!(true),
            json!({"minimum": 5, "maximum": 1}),
            json!({"type": "object", "properties": {"unit": {"enum": []}}}),
            json!({"type": "integer", "minimum": 1, "maximum": 1}),
            json!({"not": {"type": "string"}}),
        ] {
            assert_eq!(why_unsatisfiable(&schema), None, "{schema}");
        }
    }
}
