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

/// References followed in a row before a recursive schema is ended: past this, each object
/// gets only its `required` properties and each array only its `minItems`, so a schema that
/// refers to itself through an optional property or an array ends at once.
const MAX_REFS: u32 = 8;
/// Schema levels followed at most: the schema budget's depth (the edge refuses deeper
/// schemas, so a client's never reaches it); past it, `null`.
const MAX_DEPTH: u32 = crate::types::MAX_SCHEMA_DEPTH as u32;
/// Values made for one instance at most; past it, `null`. A valid instance of a schema whose
/// arrays each need 16 items, nested eight deep, has 16^8 values: no model writes that.
const MAX_VALUES: usize = 20_000;

/// A value that matches `schema` (looked up against `schema` itself for `$ref`s).
pub(crate) fn instance(schema: &Value, rng: &mut SmallRng) -> Value {
    let mut walk = Walk {
        root: schema,
        rng,
        left: MAX_VALUES,
    };
    walk.value(schema, 0, 0)
}

/// One instance being made.
struct Walk<'a> {
    root: &'a Value,
    rng: &'a mut SmallRng,
    /// Values it may still make.
    left: usize,
}

impl Walk<'_> {
    /// A value for `schema`, `depth` levels down, after `refs` references in a row.
    fn value(&mut self, schema: &Value, depth: u32, refs: u32) -> Value {
        if depth > MAX_DEPTH || self.left == 0 {
            return Value::Null;
        }
        self.left -= 1;
        let Some(s) = schema.as_object() else {
            // `true` (or anything that is not an object) accepts any value.
            return json!({});
        };
        if let Some(target) = s
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| resolve(self.root, r))
        {
            return self.value(target, depth + 1, refs + 1);
        }
        for key in ["const", "default"] {
            if let Some(v) = s.get(key) {
                return v.clone();
            }
        }
        for key in ["enum", "examples"] {
            if let Some(choices) = s.get(key).and_then(Value::as_array).filter(|a| !a.is_empty()) {
                return choices[self.rng.random_range(0..choices.len())].clone();
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
                return self.value(first, depth + 1, refs);
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
        // Deep in a chain of references: the least the schema asks for, so recursion ends.
        let least = refs > MAX_REFS;
        match kind {
            "object" => {
                let mut out = Map::new();
                let required = s.get("required").and_then(Value::as_array);
                let is_required = |name: &str| required.is_some_and(|r| r.iter().any(|n| n == name));
                if let Some(props) = s.get("properties").and_then(Value::as_object) {
                    for (name, sub) in props {
                        if !least || is_required(name) {
                            out.insert(name.clone(), self.value(sub, depth + 1, refs));
                        }
                    }
                }
                Value::Object(out)
            }
            "array" => {
                let floor = if least { 0 } else { 1 };
                let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(floor).max(floor);
                let max = s.get("maxItems").and_then(Value::as_u64).unwrap_or(min.max(2));
                let n = if least {
                    min
                } else {
                    self.rng.random_range(min..=max.max(min))
                }
                .min(16);
                let items = s.get("items").cloned().unwrap_or(Value::Bool(true));
                let mut out = Vec::new();
                for _ in 0..n {
                    if self.left == 0 {
                        break;
                    }
                    out.push(self.value(&items, depth + 1, refs));
                }
                Value::Array(out)
            }
            "string" => Value::String(string(s, self.rng)),
            "integer" => {
                let (lo, hi) = bounds(s, 0.0, 100.0);
                let (lo, hi) = (lo.ceil() as i64, hi.floor() as i64);
                json!(if lo <= hi { self.rng.random_range(lo..=hi) } else { lo })
            }
            "number" => {
                let (lo, hi) = bounds(s, 0.0, 100.0);
                let n = if lo < hi { self.rng.random_range(lo..hi) } else { lo };
                json!((n * 100.0).round() / 100.0)
            }
            "boolean" => Value::Bool(self.rng.random_bool(0.5)),
            _ => Value::Null,
        }
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
    fn a_recursive_schema_still_ends_and_is_valid() {
        let schema = json!({"type": "object", "properties": {"child": {"$ref": "#"}, "name": {"type": "string"}}, "required": ["name"]});
        let v = valid(&schema, 1);
        assert!(v.is_object(), "an object at the top: {v}");
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["kids"]}}, "$ref": "#/$defs/node"});
        valid(&tree, 2);
    }

    #[test]
    fn a_schema_nested_twenty_deep_gets_a_valid_instance() {
        let mut schema = json!({"type": "object", "properties": {"leaf": {"type": "integer"}}, "required": ["leaf"]});
        for _ in 0..20 {
            schema = json!({"type": "object", "properties": {"inner": schema}, "required": ["inner"]});
        }
        valid(&schema, 3);
    }

    #[test]
    fn a_schema_whose_valid_instances_are_huge_gets_a_bounded_one() {
        let mut schema = json!({"type": "integer"});
        for _ in 0..8 {
            schema = json!({"type": "array", "items": schema, "minItems": 16});
        }
        let mut rng = SmallRng::seed_from_u64(4);
        let v = instance(&schema, &mut rng);
        let mut count = 0usize;
        let mut stack = vec![&v];
        while let Some(node) = stack.pop() {
            count += 1;
            if let Value::Array(items) = node {
                stack.extend(items.iter());
            }
        }
        assert!(count <= MAX_VALUES, "{count} values");
    }
}
