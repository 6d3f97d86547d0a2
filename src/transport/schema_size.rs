//! How big a request's schemas are once their references are followed: what compiling them
//! (and the simulated routes' answer generator) walks.
//!
//! A schema compiler inlines each `$ref` it can (jsonschema does, all but the recursive
//! ones), so 1.6 KB of `$defs` in which each level refers twice to the next is 2^20 nodes
//! at depth 20: fifteen seconds of CPU for one request that passes every byte limit. The
//! size here counts a reference as the size of what it points at, memoised per target, so
//! it takes time linear in the schema's text, and a reference back into its own path (a
//! recursive schema) counts once.
//!
//! References are resolved as a compiler without network access resolves them: `#`, `#/…`
//! JSON pointers, `#name` anchors (`$anchor`, `$dynamicAnchor`, draft-7 `$id: "#name"`), and
//! an `$id` given in the schema itself. Any other reference (a remote URL, a relative one, a
//! percent-encoded pointer) is refused: it could not be resolved, or not be counted.

use std::collections::HashMap;

use serde_json::Value;

/// Schema nodes (objects, arrays and scalars) one request's schemas may hold in all, each
/// reference counted as what it points at. A large real tool schema has a few hundred.
pub const MAX_SCHEMA_NODES: usize = 20_000;

/// How deep references may chain and schemas nest (serde_json parses at most 128 levels).
const MAX_DEPTH: usize = 256;

/// Why a schema is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum TooBig {
    /// Over the node budget once references are followed.
    Nodes,
    /// References chain deeper than `MAX_DEPTH`.
    Depth,
    /// A reference that cannot be resolved here (its text).
    Unresolved(String),
}

/// Nodes `schema` holds with its references followed, when within `budget`.
pub fn expanded_nodes(schema: &Value, budget: usize) -> Result<usize, TooBig> {
    let mut walk = Walk {
        root: schema,
        names: HashMap::new(),
        sizes: HashMap::new(),
        budget,
    };
    walk.index(schema);
    walk.size(schema, 0)
}

struct Walk<'a> {
    root: &'a Value,
    /// Anchors and `$id`s to their schema.
    names: HashMap<&'a str, &'a Value>,
    /// Expanded size per referenced node (by address; `None` while it is being counted).
    sizes: HashMap<*const Value, Option<usize>>,
    budget: usize,
}

impl<'a> Walk<'a> {
    /// Every `$anchor`, `$dynamicAnchor` and `$id` in the schema (iterative: no recursion
    /// over a parsed value's depth).
    fn index(&mut self, root: &'a Value) {
        let mut pending = vec![root];
        while let Some(value) = pending.pop() {
            match value {
                Value::Object(map) => {
                    for key in ["$anchor", "$dynamicAnchor", "$id", "id"] {
                        if let Some(Value::String(name)) = map.get(key) {
                            self.names.entry(name.trim_start_matches('#')).or_insert(value);
                        }
                    }
                    pending.extend(map.values());
                }
                Value::Array(items) => pending.extend(items),
                _ => {}
            }
        }
    }

    fn size(&mut self, value: &'a Value, depth: usize) -> Result<usize, TooBig> {
        if depth > MAX_DEPTH {
            return Err(TooBig::Depth);
        }
        let mut total = 1usize;
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let part = match (key.as_str(), child) {
                        ("$ref" | "$dynamicRef" | "$recursiveRef", Value::String(reference)) => {
                            self.reference(reference, depth)?
                        }
                        _ => self.size(child, depth + 1)?,
                    };
                    total = self.charge(total, part)?;
                }
            }
            Value::Array(items) => {
                for item in items {
                    let part = self.size(item, depth + 1)?;
                    total = self.charge(total, part)?;
                }
            }
            _ => {}
        }
        Ok(total)
    }

    fn charge(&self, total: usize, part: usize) -> Result<usize, TooBig> {
        let total = total.saturating_add(part);
        if total > self.budget {
            return Err(TooBig::Nodes);
        }
        Ok(total)
    }

    /// The size of what `reference` points at, counted once per target.
    fn reference(&mut self, reference: &str, depth: usize) -> Result<usize, TooBig> {
        let target = self
            .resolve(reference)
            .ok_or_else(|| TooBig::Unresolved(reference.chars().take(100).collect()))?;
        let key: *const Value = target;
        match self.sizes.get(&key) {
            Some(Some(size)) => return Ok(*size),
            // Into its own path: a recursive schema, compiled as a loop, not inlined.
            Some(None) => return Ok(1),
            None => {}
        }
        self.sizes.insert(key, None);
        let size = self.size(target, depth + 1)?;
        self.sizes.insert(key, Some(size));
        Ok(size)
    }

    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        if let Some(&named) = self.names.get(reference) {
            return Some(named);
        }
        let fragment = reference.strip_prefix('#')?;
        if fragment.is_empty() {
            return Some(self.root);
        }
        if fragment.starts_with('/') {
            // `Value::pointer` reads `~0` and `~1`; a percent-encoded pointer is not read.
            return (!fragment.contains('%')).then(|| self.root.pointer(fragment)).flatten();
        }
        self.names.get(fragment).copied()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `$defs` in which each level refers twice to the next: 2^depth nodes inlined.
    fn doubling(depth: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for level in 0..depth {
            let next = format!("#/$defs/l{}", level + 1);
            defs.insert(
                format!("l{level}"),
                json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert(format!("l{depth}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/l0"})
    }

    #[test]
    fn a_plain_schema_counts_its_nodes() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]});
        // The object, "object", properties, x, "integer", required and "x".
        assert_eq!(expanded_nodes(&schema, 100), Ok(7));
    }

    #[test]
    fn references_count_what_they_point_at_so_doubling_defs_grow_exponentially() {
        let small = expanded_nodes(&doubling(4), MAX_SCHEMA_NODES).expect("depth 4 fits");
        let larger = expanded_nodes(&doubling(8), MAX_SCHEMA_NODES).expect("depth 8 fits");
        assert!(larger > small * 10, "{small} -> {larger}");
        assert_eq!(expanded_nodes(&doubling(20), MAX_SCHEMA_NODES), Err(TooBig::Nodes));
        assert!(doubling(20).to_string().len() < 4096, "a small body");
    }

    #[test]
    fn a_recursive_schema_counts_once_and_fits() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}},
            "$ref": "#/$defs/node"
        });
        assert!(
            expanded_nodes(&tree, 100).is_ok_and(|n| n < 30),
            "{:?}",
            expanded_nodes(&tree, 100)
        );
        let to_root = json!({"type": "object", "properties": {"again": {"$ref": "#"}}});
        assert!(expanded_nodes(&to_root, 100).is_ok());
    }

    #[test]
    fn anchors_and_ids_resolve_and_anything_else_is_refused() {
        let anchored = json!({
            "$defs": {"a": {"$anchor": "item", "type": "string"}},
            "properties": {"x": {"$ref": "#item"}, "y": {"$ref": "item"}}
        });
        assert!(expanded_nodes(&anchored, 100).is_ok());
        for reference in [
            "https://example.com/s.json",
            "other.json#/x",
            "#/%24defs/a",
            "#/nowhere",
        ] {
            let schema = json!({"properties": {"x": {"$ref": reference}}});
            assert!(
                matches!(expanded_nodes(&schema, 100), Err(TooBig::Unresolved(_))),
                "{reference}"
            );
        }
    }
}
