//! Micro-benchmark of the tool-call assembler: one call streamed as 12 fragments, buffered and
//! validated at the finish, with and without a JSON Schema for the tool.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::{json, Value};
use std::hint::black_box;
use tailcut::mux::tool_calls::ToolCallAssembler;
use tailcut::provider::ToolFragment;
use tailcut::types::{FinishReason, ToolSpec};

const FRAGMENTS: usize = 12;
const ARGUMENTS: &str = r#"{"city": "Paris", "unit": "celsius", "days": 3, "hourly": false}"#;

/// The call as an upstream streams it: the first fragment carries the id and name, every
/// fragment a slice of the arguments cut at arbitrary points.
fn fragments() -> Vec<ToolFragment> {
    let step = ARGUMENTS.len().div_ceil(FRAGMENTS);
    (0..FRAGMENTS)
        .map(|i| {
            let start = (i * step).min(ARGUMENTS.len());
            let end = ((i + 1) * step).min(ARGUMENTS.len());
            ToolFragment {
                index: 0,
                id: (i == 0).then(|| "call_4XzlGBLtUe9dy3GVNV4jhq7h".to_string()),
                name: (i == 0).then(|| "get_weather".to_string()),
                arguments: ARGUMENTS[start..end].to_string(),
            }
        })
        .collect()
}

fn weather_tool(parameters: Value) -> ToolSpec {
    ToolSpec {
        name: "get_weather".to_string(),
        description: Some("Current weather for a city".to_string()),
        parameters,
    }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "hourly": {"type": "boolean"}
        },
        "required": ["city"],
        "additionalProperties": false
    })
}

/// Pushes every fragment, then the terminal signal; the assembler parses and validates there.
fn assemble(assembler: &mut ToolCallAssembler, fragments: Vec<ToolFragment>) -> usize {
    assembler.reset();
    for fragment in fragments {
        black_box(assembler.push(fragment).is_ok());
    }
    assembler
        .finish(FinishReason::ToolCalls)
        .map(|calls| calls.len())
        .unwrap_or(0)
}

fn tool_calls(c: &mut Criterion) {
    let fragments = fragments();
    let mut group = c.benchmark_group("tool_calls");
    for (name, parameters) in [("no_schema", Value::Null), ("json_schema", schema())] {
        let mut assembler = ToolCallAssembler::new(&[weather_tool(parameters)]);
        group.bench_function(format!("assemble_12_fragments/{name}"), |b| {
            b.iter_batched(
                || fragments.clone(),
                |fragments| assemble(&mut assembler, fragments),
                BatchSize::SmallInput,
            )
        });
    }
    // Compiling the schema happens once per request, before any fragment arrives.
    let tools = [weather_tool(schema())];
    group.bench_function("compile_schema", |b| {
        b.iter(|| ToolCallAssembler::new(black_box(&tools)))
    });
    group.finish();
}

criterion_group!(benches, tool_calls);
criterion_main!(benches);
