//! Schemas no value can satisfy, told apart before any upstream is asked: `false`, `not` of
//! everything, an empty `enum`, or bounds that cross on the type the schema requires
//! (`minimum` over `maximum` on a number, `minLength` over `maxLength` on a string, ...),
//! at the root or in a required property, at any depth the schema budget admits
//! (`types::MAX_SCHEMA_DEPTH`), local references followed.
//!
//! Why: every answer to such a schema is invalid output, so each route was asked, failed
//! over and counted against, and the client got a 502 after all of them (an SDK retrying 5xx
//! multiplied that). Only cases that are certain are caught: a bound applies only to its own
//! type, so `{"minimum": 5, "maximum": 1}` with no `type` (a string satisfies it) passes.

use serde_json::Value;

use crate::types::{MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};

/// Why `schema` admits no value, when that is certain.
pub fn why_unsatisfiable(schema: &Value) -> Option<String> {
    let mut steps = MAX_SCHEMA_NODES;
    at(schema, schema, "", 0, &mut steps)
}

/// `schema`, `depth` JSON levels below `root` (a reference one level above its target, as
/// the budget counts). The walk ends where the budget does, so within it, it sees
/// everything: a schema the budget admits has at most `MAX_SCHEMA_NODES` subschemas with its
/// references followed, a recursive one aside, whose walk `steps` ends (two required
/// references back to the root would otherwise double at each level).
fn at(root: &Value, schema: &Value, path: &str, depth: usize, steps: &mut usize) -> Option<String> {
    if depth > MAX_SCHEMA_DEPTH || *steps == 0 {
        return None;
    }
    *steps -= 1;
    let here = if path.is_empty() { "the schema" } else { path };
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
    {
        // Its siblings apply beside it (draft 2019-09 on), so both are looked at.
        if let Some(why) = at(root, target, path, depth + 1, steps) {
            return Some(why);
        }
    }
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
    if kind.is_some_and(|k| k != "object") {
        return None;
    }
    let required = s.get("required").and_then(Value::as_array)?;
    let props = s.get("properties").and_then(Value::as_object)?;
    required.iter().filter_map(Value::as_str).find_map(|name| {
        let sub = props.get(name)?;
        at(
            root,
            sub,
            &format!("{here}'s required property {name:?}"),
            depth + 2,
            steps,
        )
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

    /// Crossed bounds `levels` required properties down.
    fn crossed_at(levels: usize) -> Value {
        (0..levels).fold(
            json!({"type": "integer", "minimum": 5, "maximum": 3}),
            |inner, _| json!({"type": "object", "properties": {"a": inner}, "required": ["a"]}),
        )
    }

    #[test]
    fn crossed_bounds_are_found_at_the_deepest_level_the_budget_admits() {
        let levels = MAX_SCHEMA_DEPTH / 2;
        let deepest = crossed_at(levels);
        assert!(crate::types::within_budget(&deepest).is_ok(), "the budget admits it");
        let why = why_unsatisfiable(&deepest).expect("found at the bottom");
        assert!(why.contains("`minimum` 5 over `maximum` 3"), "{why}");
        assert!(
            crate::types::within_budget(&crossed_at(levels + 1)).is_err(),
            "one level more is the budget's to refuse"
        );
    }

    #[test]
    fn local_references_are_followed() {
        let schema = json!({
            "$defs": {"bad": {"type": "string", "minLength": 4, "maxLength": 2}},
            "type": "object",
            "properties": {"name": {"$ref": "#/$defs/bad"}},
            "required": ["name"]
        });
        assert!(why_unsatisfiable(&schema).is_some(), "through the reference");
        let looping = json!({"type": "object", "properties": {"again": {"$ref": "#"}}, "required": ["again"]});
        assert_eq!(why_unsatisfiable(&looping), None, "a loop ends at the depth limit");
        let branching = json!({
            "type": "object",
            "properties": {"a": {"$ref": "#"}, "b": {"$ref": "#"}},
            "required": ["a", "b"]
        });
        assert_eq!(
            why_unsatisfiable(&branching),
            None,
            "a branching loop ends within its steps"
        );
    }
}
