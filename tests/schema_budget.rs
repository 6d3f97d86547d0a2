//! A client's JSON Schemas against a child `tailcut serve`: 200 distinct hostile schemas
//! (every keyword, nested to the schema budget and one level past it, alone and combined),
//! each past the budget refused with its 400, each within it answered; the server's resident
//! memory (`/proc/<pid>/status`) grows by less than 50 MiB over the whole run, and no request
//! costs it more than 50 ms of CPU (`/proc/<pid>/task/*/schedstat`). Also: every real tool and
//! response schema in `tests/fixtures/schemas/` is admitted and answered.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use support::config_toml;
use tailcut::types::MAX_SCHEMA_DEPTH;

/// A child server, killed when dropped.
struct Server {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        // The test's own HTTP client needs a TLS provider, as the server installs its own.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let scenario = "[sim.scenarios.quick]\nttft = { median_ms = 1.0, sigma = 0.0 }\ninter_token_ms = 0.0\n";
        let toml = config_toml(&[("a", "openai", "quick"), ("b", "anthropic", "quick")], scenario);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("schemas.toml");
        std::fs::write(&path, toml).expect("write the config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tailcut"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .env_remove("TAILCUT_LOG_FORMAT")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tailcut");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let base = lines
            .by_ref()
            .take(100)
            .find_map(|line| {
                let at = line.find("curl -N http://")? + "curl -N ".len();
                let url = &line[at..];
                Some(url[..url.find("/v1/")?].to_string())
            })
            .expect("the server logs its address");
        // Keep reading its log so the pipe never fills.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, base, _dir: dir }
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("read status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in {status}"))
    }

    /// CPU time the server's threads have run, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).expect("tasks");
        tasks
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

/// Levels of objects and arrays below the root (the budget's depth): `{"type": "string"}`
/// is 0, an array of them 1. A definition counts where it is referred to, one level below
/// the reference (as a compiler inlines it), not where it sits (the chains here refer to
/// definitions by anchor).
fn depth(root: &Value) -> usize {
    fn anchors<'a>(value: &'a Value, index: &mut std::collections::HashMap<String, &'a Value>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(name)) = map.get("$anchor") {
                    index.insert(format!("#{name}"), value);
                }
                map.values().for_each(|v| anchors(v, index));
            }
            Value::Array(items) => items.iter().for_each(|v| anchors(v, index)),
            _ => {}
        }
    }
    fn walk(value: &Value, index: &std::collections::HashMap<String, &Value>) -> usize {
        let children: Vec<&Value> = match value {
            Value::Object(map) => map
                .iter()
                .filter(|(k, _)| *k != "$defs")
                .filter_map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => index.get(r).copied(),
                    _ => Some(v),
                })
                .collect(),
            Value::Array(items) => items.iter().collect(),
            _ => return 0,
        };
        children
            .into_iter()
            .filter(|v| v.is_object() || v.is_array())
            .map(|v| walk(v, index) + 1)
            .max()
            .unwrap_or(0)
    }
    let mut index = std::collections::HashMap::new();
    anchors(root, &mut index);
    walk(root, &index)
}

/// The keywords a schema nests under, each wrapping `inner` once.
const KEYWORDS: &[&str] = &[
    "items",
    "properties",
    "additionalProperties",
    "not",
    "anyOf",
    "allOf",
    "oneOf",
    "prefixItems",
    "contains",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "propertyNames",
    "patternProperties",
    "unevaluatedProperties",
    "$defs",
];

fn wrap(keyword: &str, inner: Value, level: usize) -> Value {
    let name = format!("p{level}");
    match keyword {
        "items" => json!({"type": "array", "items": inner}),
        "properties" => json!({"type": "object", "properties": {name: inner}}),
        "additionalProperties" | "unevaluatedProperties" => json!({"type": "object", keyword: inner}),
        "not" => json!({"not": {"not": inner}}),
        "anyOf" | "allOf" | "oneOf" => json!({keyword: [inner]}),
        "prefixItems" => json!({"type": "array", "prefixItems": [inner]}),
        "contains" => json!({"type": "array", "contains": inner}),
        "if" => json!({"if": inner, "then": true}),
        "then" | "else" => json!({"if": {"type": "object"}, keyword: inner}),
        "dependentSchemas" => json!({"type": "object", "dependentSchemas": {name: inner}}),
        "propertyNames" => json!({"propertyNames": inner}),
        "patternProperties" => json!({"type": "object", "patternProperties": {format!("^{name}"): inner}}),
        // A definition the schema refers to by an anchor, the definitions it already had
        // moved up beside it, so they sit in one flat `$defs` as generated schemas' do.
        "$defs" => {
            let mut inner = inner;
            let mut defs = match inner.as_object_mut().and_then(|m| m.remove("$defs")) {
                Some(Value::Object(defs)) => defs,
                _ => serde_json::Map::new(),
            };
            inner["$anchor"] = json!(name);
            defs.insert(name.clone(), inner);
            json!({"$defs": defs, "$ref": format!("#{name}")})
        }
        other => unreachable!("no wrapper for {other}"),
    }
}

fn leaf(salt: usize) -> Value {
    json!({"type": "string", "description": format!("leaf {salt}")})
}

/// Wraps a leaf in `keywords` (cycled) until one more wrapper would take it past `limit`
/// levels; `past` adds that one more.
fn chain(keywords: &[&str], limit: usize, past: bool, salt: usize) -> Value {
    let mut schema = leaf(salt);
    for level in 0.. {
        let next = wrap(keywords[level % keywords.len()], schema.clone(), level);
        if depth(&next) > limit {
            if past {
                schema = next;
            }
            break;
        }
        schema = next;
    }
    schema
}

/// Where a schema goes in a request.
#[derive(Clone, Copy, Debug)]
enum Place {
    OpenAiTool,
    AnthropicTool,
    ResponseFormat,
}

fn request(place: Place, schema: &Value) -> (&'static str, Value) {
    match place {
        Place::OpenAiTool => (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
                   "tools": [{"type": "function", "function": {"name": "t", "parameters":
                       {"type": "object", "properties": {"x": schema}}}}]}),
        ),
        Place::AnthropicTool => (
            "/v1/messages",
            json!({"model": "chat", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}],
                   "tool_choice": {"type": "none"},
                   "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {"x": schema}}}]}),
        ),
        Place::ResponseFormat => (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema":
                       {"type": "object", "properties": {"x": schema}, "required": ["x"]}}}}),
        ),
    }
}

/// The schemas: each keyword alone and in combinations, at the budget and one past it. The
/// schema sits two levels below its tool's root (`properties`, `x`), so its own limit is two
/// less than the budget.
fn hostile() -> Vec<(Value, bool)> {
    let limit = MAX_SCHEMA_DEPTH - 2;
    let mut schemas = Vec::new();
    for (i, keyword) in KEYWORDS.iter().enumerate() {
        for past in [false, true] {
            schemas.push((chain(&[keyword], limit, past, i), past));
        }
    }
    // Pairs and triples of keywords, in several orders.
    let mut salt = 100;
    'outer: for stride in 1..KEYWORDS.len() {
        for start in 0..KEYWORDS.len() {
            let combo: Vec<&str> = (0..(2 + stride % 2))
                .map(|k| KEYWORDS[(start + k * stride) % KEYWORDS.len()])
                .collect();
            for past in [false, true] {
                schemas.push((chain(&combo, limit, past, salt), past));
                salt += 1;
            }
            if schemas.len() >= 200 {
                break 'outer;
            }
        }
    }
    schemas
}

#[tokio::test]
async fn two_hundred_hostile_schemas_cost_bounded_memory_and_cpu_and_each_gets_its_answer() {
    let server = Server::start();
    let client = support::client();
    let send = |path: &'static str, body: Value| {
        let client = client.clone();
        let url = format!("{}{path}", server.base);
        async move {
            let resp = client.post(url).json(&body).send().await.expect("sent");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Warm-up: the first request of each kind builds what every later one shares (the
    // meta-schema validator, the routes' connections).
    for place in [Place::OpenAiTool, Place::AnthropicTool, Place::ResponseFormat] {
        let (path, body) = request(place, &json!({"type": "array", "items": {"type": "string"}}));
        let (status, reply) = send(path, body).await;
        assert_eq!(status, 200, "a plain schema is answered ({place:?}): {reply}");
    }
    let rss_before = server.status_kib("VmRSS:");

    let schemas = hostile();
    assert_eq!(schemas.len(), 200, "200 schemas");
    let distinct: std::collections::HashSet<String> = schemas.iter().map(|(s, _)| s.to_string()).collect();
    assert_eq!(distinct.len(), schemas.len(), "all distinct");
    let mut worst_cpu = (0u64, String::new());
    for (i, (schema, past)) in schemas.iter().enumerate() {
        // The response format only for the chains the simulated routes can answer exactly
        // (its answers must match): the tools carry every keyword.
        let place = if i % 3 == 1 {
            Place::AnthropicTool
        } else {
            Place::OpenAiTool
        };
        let (path, body) = request(place, schema);
        let before = server.cpu_ns();
        let (status, reply) = send(path, body).await;
        let cpu = server.cpu_ns() - before;
        if cpu > worst_cpu.0 {
            worst_cpu = (cpu, format!("#{i} ({place:?}, past: {past})"));
        }
        if *past {
            assert_eq!(
                status, 400,
                "#{i} past the budget is refused ({place:?}): {reply} for {schema}"
            );
            let text = reply.to_string();
            assert!(
                text.contains("invalid_tool_schema") || text.contains("over the schema budget"),
                "#{i}: {text}"
            );
            assert!(
                text.contains(&format!("{MAX_SCHEMA_DEPTH} levels")),
                "#{i} names the limit: {text}"
            );
        } else {
            assert_eq!(
                status, 200,
                "#{i} within the budget is answered ({place:?}): {reply} for {schema}"
            );
        }
    }
    // Response formats within and past the budget: chains the simulated routes answer with
    // a matching instance (a 62-deep `items` chain they do not: see the closing note).
    for (i, keyword) in ["properties", "anyOf", "allOf", "oneOf"].iter().enumerate() {
        for past in [false, true] {
            let schema = chain(&[keyword], MAX_SCHEMA_DEPTH - 2, past, 1000 + i);
            let (path, body) = request(Place::ResponseFormat, &schema);
            let (status, reply) = send(path, body).await;
            let expected = if past { 400 } else { 200 };
            assert_eq!(status, expected, "response format {keyword} past: {past}: {reply}");
            if past {
                assert_eq!(reply["error"]["code"], "invalid_response_schema", "{reply}");
                assert_eq!(reply["error"]["param"], "response_format", "{reply}");
            }
        }
    }
    let rss_after = server.status_kib("VmRSS:");
    let grown_mib = (rss_after.saturating_sub(rss_before)) as f64 / 1024.0;
    eprintln!(
        "RSS {rss_before} -> {rss_after} KiB ({grown_mib:.1} MiB); the costliest request: {} at {:.1} ms of CPU",
        worst_cpu.1,
        worst_cpu.0 as f64 / 1e6
    );
    assert!(
        grown_mib < 50.0,
        "resident memory grew {grown_mib:.1} MiB over the run ({rss_before} -> {rss_after} KiB)"
    );
    assert!(
        worst_cpu.0 < 50_000_000,
        "no request costs the server more than 50 ms of CPU: {} took {:.1} ms",
        worst_cpu.1,
        worst_cpu.0 as f64 / 1e6
    );
}

#[tokio::test]
async fn every_real_tool_and_response_schema_is_admitted_and_answered() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the fixtures")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "a set of real schemas: {}", files.len());
    let server = Server::start();
    let client = support::client();
    for file in &files {
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("JSON");
        for (path, body) in [
            (
                "/v1/chat/completions",
                json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
                       "tools": [{"type": "function", "function": {"name": "t", "parameters": schema}}]}),
            ),
            (
                "/v1/messages",
                json!({"model": "chat", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"name": "t", "input_schema": schema}], "tool_choice": {"type": "none"}}),
            ),
        ] {
            let resp = client
                .post(format!("{}{path}", server.base))
                .json(&body)
                .send()
                .await
                .expect("sent");
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            assert_eq!(status, 200, "{} is admitted on {path}: {text}", file.display());
        }
    }
}
