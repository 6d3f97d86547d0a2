//! An instance of a JSON schema, as a model honouring a tool's `parameters` or a
//! `json_schema` response format writes one: every property present, values drawn from the
//! schema's own words (`enum`, `const`, `default`, `examples`) or made up within its bounds.
//!
//! Written here because no maintained crate generates instances (the schema crates only
//! validate); it covers the subset tool and output schemas use in practice: `type` (one or a
//! list), `properties`, `items`, `enum`, `const`, `default`, `examples`, `anyOf` / `oneOf` /
//! `allOf` (the first branch), `minimum` / `maximum`, `minItems`, `minLength`, and local
//! `$ref`s into `$defs` / `definitions`. A schema it cannot read gets an empty object.

use rand::rngs::SmallRng;
use rand::Rng;
use serde_json::{json, Map, Value};

use super::answer::WORDS;

/// Nesting beyond this gets `null`, so a recursive schema still ends.
const MAX_DEPTH: u32 = 8;

/// A value that matches `schema` (looked up against `root` for `$ref`s).
pub(crate) fn instance(schema: &Value, rng: &mut SmallRng) -> Value {
    value(schema, schema, rng, 0)
}

fn value(schema: &Value, root: &Value, rng: &mut SmallRng, depth: u32) -> Value {
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    let Some(s) = schema.as_object() else {
        // `true` (or anything that is not an object) accepts any value.
        return json!({});
    };
    if let Some(target) = s.get("$ref").and_then(Value::as_str).and_then(|r| resolve(root, r)) {
        return value(target, root, rng, depth + 1);
    }
    for key in ["const", "default"] {
        if let Some(v) = s.get(key) {
            return v.clone();
        }
    }
    for key in ["enum", "examples"] {
        if let Some(choices) = s.get(key).and_then(Value::as_array).filter(|a| !a.is_empty()) {
            return choices[rng.random_range(0..choices.len())].clone();
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
            return value(first, root, rng, depth + 1);
        }
    }
    let kind = match s.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // A list of types: the first that is not null.
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if s.contains_key("properties") => "object",
        _ if s.contains_key("items") => "array",
        _ => "object",
    };
    match kind {
        "object" => {
            let mut out = Map::new();
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (name, sub) in props {
                    out.insert(name.clone(), value(sub, root, rng, depth + 1));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(1).max(1);
            let max = s.get("maxItems").and_then(Value::as_u64).unwrap_or(min.max(2));
            let n = rng.random_range(min..=max.max(min)).min(16);
            let items = s.get("items").cloned().unwrap_or(Value::Bool(true));
            Value::Array((0..n).map(|_| value(&items, root, rng, depth + 1)).collect())
        }
        "string" => Value::String(string(s, rng)),
        "integer" => {
            let (lo, hi) = bounds(s, 0.0, 100.0);
            let (lo, hi) = (lo.ceil() as i64, hi.floor() as i64);
            json!(if lo <= hi { rng.random_range(lo..=hi) } else { lo })
        }
        "number" => {
            let (lo, hi) = bounds(s, 0.0, 100.0);
            let n = if lo < hi { rng.random_range(lo..hi) } else { lo };
            json!((n * 100.0).round() / 100.0)
        }
        "boolean" => Value::Bool(rng.random_bool(0.5)),
        _ => Value::Null,
    }
}

/// `minimum`/`maximum` (exclusive ones nudged inward), defaulting to `[lo, hi]` around them.
fn bounds(s: &Map<String, Value>, lo: f64, hi: f64) -> (f64, f64) {
    let get = |k: &str| s.get(k).and_then(Value::as_f64);
    let min = get("minimum").or(get("exclusiveMinimum").map(|m| m + 1.0));
    let max = get("maximum").or(get("exclusiveMaximum").map(|m| m - 1.0));
    match (min, max) {
        (Some(a), Some(b)) => (a, b),
        (Some(a), None) => (a, a + (hi - lo)),
        (None, Some(b)) => (b - (hi - lo), b),
        (None, None) => (lo, hi),
    }
}

/// A word or two from the vocabulary, at least `minLength` chars, at most `maxLength`.
fn string(s: &Map<String, Value>, rng: &mut SmallRng) -> String {
    let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(1) as usize;
    let max = s.get("maxLength").and_then(Value::as_u64).map(|m| m as usize);
    let mut text = String::new();
    while text.chars().count() < min.max(1) {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    if let Some(max) = max {
        text = text.chars().take(max).collect();
    }
    text
}

/// A local JSON pointer such as `#/$defs/City`.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn valid(schema: &Value, seed: u64) -> Value {
        let mut rng = SmallRng::seed_from_u64(seed);
        let v = instance(schema, &mut rng);
        let validator = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("schema compiles: {e}"));
        assert!(validator.is_valid(&v), "{v} is an instance of {schema}");
        v
    }

    #[test]
    fn tool_schemas_get_valid_instances() {
        let weather = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "unit"],
            "additionalProperties": false
        });
        for seed in 0..50 {
            valid(&weather, seed);
        }
    }

    #[test]
    fn nested_arrays_refs_unions_and_bounds_are_honoured() {
        let schema = json!({
            "type": "object",
            "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 4}, "qty": {"type": "number", "exclusiveMinimum": 0}}, "required": ["sku", "qty"]}},
            "properties": {
                "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 2},
                "note": {"type": ["string", "null"]},
                "kind": {"anyOf": [{"const": "order"}, {"const": "quote"}]},
                "ok": {"type": "boolean"}
            },
            "required": ["items", "note", "kind", "ok"]
        });
        for seed in 0..50 {
            let v = valid(&schema, seed);
            assert!(v["items"].as_array().is_some_and(|a| a.len() >= 2), "minItems: {v}");
        }
    }

    #[test]
    fn a_recursive_schema_still_ends() {
        let schema = json!({"type": "object", "properties": {"child": {"$ref": "#"}}});
        let mut rng = SmallRng::seed_from_u64(1);
        let v = instance(&schema, &mut rng);
        assert!(v.is_object(), "an object at the top: {v}");
    }
}
