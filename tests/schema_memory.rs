//! Compiling a client's schema keeps nothing: after a warm-up (the meta-schema validators and
//! the other one-time statics), compiling and dropping arbitrary nested schemas within the
//! schema budget leaves the live heap bytes exactly where they were. A test binary of its
//! own: its global allocator counts every byte.
//!
//! jsonschema 0.33's meta-schema validator was a process-wide static that compiled, and kept,
//! a subtree of the meta-schema for each level of a validated schema's nesting (its lazily
//! resolved `$dynamicRef`s): 100 levels of `items` kept 735 MiB. This test fails on it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Value};
use tailcut::mux::tool_calls::Gates;
use tailcut::types::{within_budget, ChatRequest, ResponseFormat, ToolSpec};

/// Live heap bytes: allocated less freed.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call goes to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Schemas of every keyword tool and response schemas use, nested up to 24 levels of
/// keywords (at most 48 levels of JSON, within the budget's 64).
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        (0i64..100).prop_map(|n| json!({"type": "integer", "minimum": n, "maximum": n + 10})),
        Just(json!(true)),
        "[a-z]{1,8}".prop_map(|p| json!({"type": "string", "pattern": format!("^{p}[0-9]*$")})),
        prop::collection::vec("[a-z]{1,6}", 1..5).prop_map(|e| json!({"enum": e})),
        Just(json!({"type": "string", "format": "date-time"})),
        Just(json!({"$ref": "#"})),
    ];
    leaf.prop_recursive(24, 200, 3, |inner| {
        prop_oneof![
            inner
                .clone()
                .prop_map(|s| json!({"type": "array", "items": s, "minItems": 0})),
            prop::collection::btree_map("[a-z]{1,5}", inner.clone(), 1..3)
                .prop_map(|props| json!({"type": "object", "properties": props, "additionalProperties": false})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"anyOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"oneOf": v})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|v| json!({"allOf": v})),
            inner.clone().prop_map(|s| json!({"not": {"not": s}})),
            inner
                .clone()
                .prop_map(|s| json!({"type": "object", "additionalProperties": s})),
            inner
                .clone()
                .prop_map(|s| json!({"type": "object", "unevaluatedProperties": s})),
            inner
                .clone()
                .prop_map(|s| json!({"type": "array", "prefixItems": [s], "contains": true})),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| json!({"if": a, "then": b, "else": true})),
            inner
                .clone()
                .prop_map(|s| json!({"type": "object", "dependentSchemas": {"k": s}})),
            inner.clone().prop_map(|s| json!({"propertyNames": s})),
            inner
                .clone()
                .prop_map(|s| json!({"type": "object", "patternProperties": {"^x": s}})),
            inner.prop_map(|s| json!({"$defs": {"d": s}, "$ref": "#/$defs/d"})),
        ]
    })
}

fn request(tool: Value, format: Value) -> ChatRequest {
    ChatRequest {
        tools: vec![ToolSpec {
            name: "t".into(),
            description: None,
            parameters: tool,
        }],
        response_format: Some(ResponseFormat::JsonSchema {
            name: "answer".into(),
            schema: format,
            strict: None,
        }),
        ..ChatRequest::default()
    }
}

/// Live bytes that compiling and dropping `req`'s schemas leaves behind.
fn left_behind(req: &ChatRequest) -> isize {
    let before = LIVE.load(Ordering::Relaxed);
    drop(Gates::compile(req));
    LIVE.load(Ordering::Relaxed) - before
}

#[test]
fn compiling_and_dropping_schemas_within_the_budget_keeps_no_memory() {
    // Warm-up: one schema of each keyword builds every one-time static (the meta-schema
    // validators, format checkers, regex engines).
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..64 {
        let tool = schema().new_tree(&mut runner).expect("a schema").current();
        let format = schema().new_tree(&mut runner).expect("a schema").current();
        drop(Gates::compile(&request(tool, format)));
    }
    // 100 levels of `items`, the case that kept 735 MiB: refused by the budget, so compiled
    // here straight with the crate (the cause is under test, not the budget). Once warm, a
    // deeper one and one of another keyword keep nothing either: 0.33 kept about 7 MiB for
    // each new level.
    let items =
        |levels: usize| (0..levels).fold(json!({"type": "string"}), |s, _| json!({"type": "array", "items": s}));
    let properties = |levels: usize| {
        (0..levels).fold(
            json!({"type": "string"}),
            |s, _| json!({"type": "object", "properties": {"a": s}}),
        )
    };
    assert!(within_budget(&items(100)).is_err(), "over the budget");
    drop(jsonschema::validator_for(&items(100)));
    for (what, deep) in [
        ("101 levels of items", items(101)),
        ("60 levels of properties", properties(60)),
    ] {
        let before = LIVE.load(Ordering::Relaxed);
        drop(jsonschema::validator_for(&deep));
        let kept = LIVE.load(Ordering::Relaxed) - before;
        assert_eq!(kept, 0, "compiling {what} kept {kept} bytes");
    }

    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
    runner
        .run(&(schema(), schema()), |(tool, format)| {
            prop_assume!(within_budget(&tool).is_ok() && within_budget(&format).is_ok());
            let req = request(tool, format);
            let kept = left_behind(&req);
            prop_assert_eq!(kept, 0, "compiling and dropping kept {} bytes", kept);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
