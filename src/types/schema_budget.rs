//! What a client's JSON Schema may cost, counted on its parsed JSON before anything compiles,
//! walks or answers it: the one budget the edge's check, the compile step, the
//! unsatisfiability walk and the simulated routes' answer generator share.
//!
//! Why one budget: each of those had a limit of its own (nodes and depth 256 at the edge,
//! depth 32 in the walk, 128 in the simulator), so a schema could pass the edge, be compiled,
//! and be deeper than the walk could see. Now nothing deeper than [`MAX_SCHEMA_DEPTH`] is
//! compiled or walked anywhere.
//!
//! What is counted, per request (tools' parameters and a `json_schema` response format
//! together), except depth, which is per schema:
//! - **depth**: JSON nesting from the schema's root, a `$ref` one level above what it points
//!   at (a compiler inlines it there);
//! - **nodes** (objects, arrays, scalars) and **keywords** (object members), each reference
//!   counted as what it points at, memoised per target, so the walk takes time linear in the
//!   text: 1.6 KB of `$defs` in which each level refers twice to the next is 2^20 nodes at
//!   depth 20. A reference back into its own path (a recursive schema, compiled as a loop)
//!   counts once; `$defs` and `definitions` are counted where they are referred to, as a
//!   compiler compiles them, not where they sit;
//! - **references**, **regular expressions** (`pattern` strings, `patternProperties` keys)
//!   and the JSON text of **`enum` and `const` values**, as written.
//!
//! References resolve as a compiler without network access resolves them: `#`, `#/…` JSON
//! pointers, `#name` anchors (`$anchor`, `$dynamicAnchor`, draft-7 `$id: "#name"`), and an
//! `$id` given in the schema itself. Any other reference (a remote URL, a relative one, a
//! percent-encoded pointer) is refused: it could not be resolved, or not be counted.
//!
//! The defaults refuse no real schema: the tool schemas of agent frameworks and MCP servers
//! nest under 16 levels and hold a few hundred nodes (`tests/fixtures/schemas/`, each
//! admitted by a test). OpenAI's own structured-output limits are stricter still (10 levels
//! of nesting, 5,000 properties).

use std::collections::HashMap;

use serde_json::Value;

/// Levels of JSON objects and arrays one schema may nest below its root, references followed.
/// A property nests two levels (`properties`, then its name), an `items` one: 64 is 32
/// levels of objects.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// Schema nodes (objects, arrays and scalars) one request's schemas may hold in all, each
/// reference counted as what it points at. A large real tool schema has a few hundred.
pub const MAX_SCHEMA_NODES: usize = 20_000;

/// Object members (keywords, property names) one request's schemas may hold in all,
/// references followed.
pub const MAX_SCHEMA_KEYWORDS: usize = 10_000;

/// `$ref`, `$dynamicRef` and `$recursiveRef` keywords one request's schemas may write.
pub const MAX_SCHEMA_REFS: usize = 512;

/// Regular expressions (`pattern` strings and `patternProperties` keys) one request's
/// schemas may hold in all; each compiles to an automaton (`mux::tool_calls` shares a regex
/// budget between them).
pub const MAX_SCHEMA_PATTERNS: usize = 32;

/// Bytes of JSON text all the `enum` and `const` values of one request's schemas may take.
pub const MAX_SCHEMA_LITERAL_BYTES: usize = 256 * 1024;

/// Which limit a schema goes past.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("it nests deeper than {MAX_SCHEMA_DEPTH} levels (references followed)")]
    Depth,
    #[error(
        "the request's schemas hold more than {MAX_SCHEMA_NODES} nodes once their references are \
         followed (tools and response format together)"
    )]
    Nodes,
    #[error(
        "the request's schemas hold more than {MAX_SCHEMA_KEYWORDS} keywords once their references \
         are followed (tools and response format together)"
    )]
    Keywords,
    #[error("the request's schemas write more than {MAX_SCHEMA_REFS} references (`$ref`)")]
    Refs,
    #[error(
        "the request's schemas hold more than {MAX_SCHEMA_PATTERNS} regular expressions \
         (`pattern`, `patternProperties`; tools and response format together)"
    )]
    Patterns,
    #[error(
        "the request's `enum` and `const` values take more than {} KiB of JSON text",
        MAX_SCHEMA_LITERAL_BYTES >> 10
    )]
    Literals,
    #[error(
        "the reference {0:?} cannot be resolved: only references within the schema are (`#`, \
         `#/json/pointer`, `#anchor`, an `$id` it gives)"
    )]
    Unresolved(String),
}

/// What is left of one request's budget; each of its schemas is charged in turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaBudget {
    nodes: usize,
    keywords: usize,
    refs: usize,
    patterns: usize,
    literal_bytes: usize,
}

impl Default for SchemaBudget {
    fn default() -> Self {
        SchemaBudget {
            nodes: MAX_SCHEMA_NODES,
            keywords: MAX_SCHEMA_KEYWORDS,
            refs: MAX_SCHEMA_REFS,
            patterns: MAX_SCHEMA_PATTERNS,
            literal_bytes: MAX_SCHEMA_LITERAL_BYTES,
        }
    }
}

impl SchemaBudget {
    /// Charges `schema` against what is left, or says which limit it goes past. A refused
    /// schema may have taken part of the budget: the request is refused anyway.
    pub fn charge(&mut self, schema: &Value) -> Result<(), OverBudget> {
        let mut walk = Walk {
            root: schema,
            names: HashMap::new(),
            sizes: HashMap::new(),
            nodes: self.nodes,
            keywords: self.keywords,
        };
        let written = walk.index(schema);
        self.refs = self.refs.checked_sub(written.refs).ok_or(OverBudget::Refs)?;
        self.patterns = self
            .patterns
            .checked_sub(written.patterns)
            .ok_or(OverBudget::Patterns)?;
        self.literal_bytes = self
            .literal_bytes
            .checked_sub(written.literal_bytes)
            .ok_or(OverBudget::Literals)?;
        walk.size(schema, 0)?;
        self.nodes = walk.nodes;
        self.keywords = walk.keywords;
        Ok(())
    }
}

/// `schema` alone within a whole request's budget: what the compile step checks.
pub fn within_budget(schema: &Value) -> Result<(), OverBudget> {
    SchemaBudget::default().charge(schema)
}

/// What a schema's text writes.
#[derive(Default)]
struct Written {
    refs: usize,
    patterns: usize,
    literal_bytes: usize,
}

/// A reference target's cost, once counted.
#[derive(Clone, Copy)]
struct Cost {
    nodes: usize,
    keywords: usize,
    /// Levels of objects and arrays from the target down, itself included (0 for a scalar).
    height: usize,
}

struct Walk<'a> {
    root: &'a Value,
    /// Anchors and `$id`s to their schema.
    names: HashMap<&'a str, &'a Value>,
    /// Expanded cost per referenced node (by address; `None` while it is being counted).
    sizes: HashMap<*const Value, Option<Cost>>,
    /// Nodes and keywords still allowed.
    nodes: usize,
    keywords: usize,
}

impl<'a> Walk<'a> {
    /// Indexes every `$anchor`, `$dynamicAnchor` and `$id`, and counts what the text writes
    /// (iterative: no recursion over the parsed value's depth).
    fn index(&mut self, root: &'a Value) -> Written {
        let mut written = Written::default();
        let mut pending = vec![root];
        while let Some(value) = pending.pop() {
            match value {
                Value::Object(map) => {
                    for key in ["$anchor", "$dynamicAnchor", "$id", "id"] {
                        if let Some(Value::String(name)) = map.get(key) {
                            self.names.entry(name.trim_start_matches('#')).or_insert(value);
                        }
                    }
                    for (key, child) in map {
                        match (key.as_str(), child) {
                            ("$ref" | "$dynamicRef" | "$recursiveRef", Value::String(_)) => {
                                written.refs += 1;
                            }
                            ("enum" | "const", literal) => {
                                written.literal_bytes = written.literal_bytes.saturating_add(json_len(literal));
                            }
                            _ => {}
                        }
                        written.patterns += patterns_at(key, child);
                    }
                    pending.extend(map.values());
                }
                Value::Array(items) => pending.extend(items),
                _ => {}
            }
        }
        written
    }

    /// The cost of `value`, `depth` levels below the schema's root, charged as it goes.
    fn size(&mut self, value: &'a Value, depth: usize) -> Result<Cost, OverBudget> {
        let container = value.is_object() || value.is_array();
        if container && depth > MAX_SCHEMA_DEPTH {
            return Err(OverBudget::Depth);
        }
        self.nodes = self.nodes.checked_sub(1).ok_or(OverBudget::Nodes)?;
        let mut cost = Cost {
            nodes: 1,
            keywords: 0,
            height: usize::from(container),
        };
        match value {
            Value::Object(map) => {
                self.keywords = self.keywords.checked_sub(map.len()).ok_or(OverBudget::Keywords)?;
                cost.keywords = map.len();
                for (key, child) in map {
                    let part = match (key.as_str(), child) {
                        ("$ref" | "$dynamicRef" | "$recursiveRef", Value::String(reference)) => {
                            self.reference(reference, depth)?
                        }
                        // Definitions are compiled where they are referred to, and counted
                        // there: counted here too, a chain of definitions that each hold the
                        // next and refer to it would count twice per level.
                        ("$defs" | "definitions", Value::Object(defs)) => {
                            self.nodes = self.nodes.checked_sub(1).ok_or(OverBudget::Nodes)?;
                            self.keywords = self.keywords.checked_sub(defs.len()).ok_or(OverBudget::Keywords)?;
                            Cost {
                                nodes: 1,
                                keywords: defs.len(),
                                height: 1,
                            }
                        }
                        _ => self.size(child, depth + 1)?,
                    };
                    cost.add(part);
                }
            }
            Value::Array(items) => {
                for item in items {
                    let part = self.size(item, depth + 1)?;
                    cost.add(part);
                }
            }
            _ => {}
        }
        Ok(cost)
    }

    /// The cost of what `reference` points at, counted once per target and charged at each
    /// reference to it.
    fn reference(&mut self, reference: &str, depth: usize) -> Result<Cost, OverBudget> {
        let target = self
            .resolve(reference)
            .ok_or_else(|| OverBudget::Unresolved(reference.chars().take(100).collect()))?;
        let key: *const Value = target;
        match self.sizes.get(&key) {
            Some(Some(cost)) => {
                let cost = *cost;
                if depth + cost.height > MAX_SCHEMA_DEPTH {
                    return Err(OverBudget::Depth);
                }
                self.nodes = self.nodes.checked_sub(cost.nodes).ok_or(OverBudget::Nodes)?;
                self.keywords = self.keywords.checked_sub(cost.keywords).ok_or(OverBudget::Keywords)?;
                return Ok(cost);
            }
            // Into its own path: a recursive schema, compiled as a loop, not inlined.
            Some(None) => {
                self.nodes = self.nodes.checked_sub(1).ok_or(OverBudget::Nodes)?;
                return Ok(Cost {
                    nodes: 1,
                    keywords: 0,
                    height: 0,
                });
            }
            None => {}
        }
        self.sizes.insert(key, None);
        let cost = self.size(target, depth + 1)?;
        self.sizes.insert(key, Some(cost));
        Ok(cost)
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

impl Cost {
    fn add(&mut self, part: Cost) {
        self.nodes = self.nodes.saturating_add(part.nodes);
        self.keywords = self.keywords.saturating_add(part.keywords);
        self.height = self.height.max(part.height + 1);
    }
}

/// The regular expressions a schema keyword holds: one for a `pattern` string, one per key
/// of `patternProperties`, none for anything else.
pub fn patterns_at(key: &str, value: &Value) -> usize {
    match (key, value) {
        ("pattern", Value::String(_)) => 1,
        ("patternProperties", Value::Object(props)) => props.len(),
        _ => 0,
    }
}

/// The length of `value`'s compact JSON text, without writing it anywhere.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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

    /// `{"type": "array", "items": …}` nested `levels` deep around a string.
    fn items(levels: usize) -> Value {
        (0..levels).fold(
            json!({"type": "string"}),
            |inner, _| json!({"type": "array", "items": inner}),
        )
    }

    fn used(schema: &Value) -> SchemaBudget {
        let mut budget = SchemaBudget::default();
        budget.charge(schema).expect("within the budget");
        budget
    }

    #[test]
    fn a_plain_schema_counts_its_nodes_and_keywords() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]});
        let left = used(&schema);
        // The object, "object", properties, x, "integer", required and "x".
        assert_eq!(MAX_SCHEMA_NODES - left.nodes, 7, "nodes");
        // type, properties, required; x; x's type.
        assert_eq!(MAX_SCHEMA_KEYWORDS - left.keywords, 5, "keywords");
    }

    #[test]
    fn depth_is_refused_one_level_past_the_limit_and_counts_through_references() {
        // `items` nests one level per array: the string sits MAX_SCHEMA_DEPTH levels down.
        assert!(within_budget(&items(MAX_SCHEMA_DEPTH)).is_ok(), "at the limit");
        assert_eq!(within_budget(&items(MAX_SCHEMA_DEPTH + 1)), Err(OverBudget::Depth));
        // Half the depth in a definition, referred to from half the depth: the whole depth.
        let half = MAX_SCHEMA_DEPTH / 2;
        let mut deep = items(half);
        let mut spot = &mut deep;
        for _ in 0..half {
            spot = &mut spot["items"];
        }
        *spot = json!({"$ref": "#/$defs/inner"});
        let defs = json!({"inner": items(half + 1)});
        deep["$defs"] = defs;
        assert_eq!(
            within_budget(&deep),
            Err(OverBudget::Depth),
            "the reference adds its target's depth"
        );
    }

    #[test]
    fn references_count_what_they_point_at_so_doubling_defs_grow_exponentially() {
        let small = MAX_SCHEMA_NODES - used(&doubling(4)).nodes;
        let larger = MAX_SCHEMA_NODES - used(&doubling(8)).nodes;
        assert!(larger > small * 10, "{small} -> {larger}");
        assert!(
            matches!(
                within_budget(&doubling(20)),
                Err(OverBudget::Nodes | OverBudget::Keywords)
            ),
            "{:?}",
            within_budget(&doubling(20))
        );
        assert!(doubling(20).to_string().len() < 4096, "a small body");
    }

    #[test]
    fn definitions_count_where_they_are_referred_to_not_where_they_sit() {
        // Each level defines the next inside itself and refers to it: linear to compile.
        let chain = (0..40).fold(json!({"type": "string"}), |inner, level| {
            let name = format!("d{level}");
            let mut inner = inner;
            inner["$anchor"] = json!(name);
            json!({"$defs": {name.clone(): inner}, "$ref": format!("#{name}")})
        });
        let left = used(&chain);
        assert!(MAX_SCHEMA_NODES - left.nodes < 1_000, "{:?}", left);
        let unused = json!({"$defs": {"big": {"enum": (0..5000).collect::<Vec<_>>()}}, "type": "string"});
        assert!(
            MAX_SCHEMA_NODES - used(&unused).nodes < 10,
            "a definition nothing refers to costs no compile"
        );
    }

    #[test]
    fn a_recursive_schema_counts_once_and_fits() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}},
            "$ref": "#/$defs/node"
        });
        let left = used(&tree);
        assert!(MAX_SCHEMA_NODES - left.nodes < 30, "{:?}", left);
        assert!(within_budget(&json!({"type": "object", "properties": {"again": {"$ref": "#"}}})).is_ok());
    }

    #[test]
    fn anchors_and_ids_resolve_and_anything_else_is_refused() {
        let anchored = json!({
            "$defs": {"a": {"$anchor": "item", "type": "string"}},
            "properties": {"x": {"$ref": "#item"}, "y": {"$ref": "item"}}
        });
        assert!(within_budget(&anchored).is_ok());
        for reference in [
            "https://example.com/s.json",
            "other.json#/x",
            "#/%24defs/a",
            "#/nowhere",
        ] {
            let schema = json!({"properties": {"x": {"$ref": reference}}});
            assert!(
                matches!(within_budget(&schema), Err(OverBudget::Unresolved(_))),
                "{reference}"
            );
        }
    }

    #[test]
    fn written_counts_add_up_across_a_requests_schemas() {
        let patterned = json!({"properties": {"a": {"pattern": "^a$"}}, "patternProperties": {"^x": {}}});
        let mut budget = SchemaBudget::default();
        for _ in 0..MAX_SCHEMA_PATTERNS / 2 {
            budget.charge(&patterned).expect("two patterns each");
        }
        assert_eq!(
            budget.charge(&patterned),
            Err(OverBudget::Patterns),
            "the 33rd and 34th"
        );

        let refs = json!({"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s"}}});
        let mut budget = SchemaBudget::default();
        for _ in 0..MAX_SCHEMA_REFS {
            budget.charge(&refs).expect("one reference each");
        }
        assert_eq!(budget.charge(&refs), Err(OverBudget::Refs));

        let words: Vec<String> = (0..2000).map(|i| format!("word-{i:08}")).collect();
        let listed = json!({"enum": words});
        let mut budget = SchemaBudget::default();
        let fits = MAX_SCHEMA_LITERAL_BYTES / json_len(&listed["enum"]);
        for _ in 0..fits {
            budget.charge(&listed).expect("within the literal bytes");
        }
        assert_eq!(budget.charge(&listed), Err(OverBudget::Literals));
        assert!(fits >= 4, "a 2,000-word enum fits several times over");
    }

    #[test]
    fn the_keyword_count_is_its_own_limit() {
        // Keywords without values to speak of: `{"a0": true, …}` as properties.
        let props: serde_json::Map<String, Value> = (0..MAX_SCHEMA_KEYWORDS)
            .map(|i| (format!("a{i}"), json!(true)))
            .collect();
        let schema = json!({"type": "object", "properties": props});
        assert_eq!(within_budget(&schema), Err(OverBudget::Keywords));
    }

    #[test]
    fn the_json_length_is_the_compact_texts() {
        for value in [json!(null), json!("é\"x"), json!([1, 2.5, {"a": [true]}])] {
            assert_eq!(json_len(&value), value.to_string().len(), "{value}");
        }
    }
}
