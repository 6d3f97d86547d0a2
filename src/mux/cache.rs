//! The L3 answer cache: complete answers keyed by the normalised request, served only when no
//! generating route can answer. Opt-in, bounded in entries and answer size, with a TTL; pure
//! state that takes `now`.
//!
//! The key covers everything that shapes an answer: model, messages (text trimmed of
//! surrounding whitespace), tools, tool choice, response format, sampling and `max_tokens`.
//! Transport details (`stream`, `include_usage`) and client metadata are left out. Keys are
//! 128 bits from two independently seeded SipHash keys chosen at startup, so a client cannot
//! craft a request that collides with another's answer, and no prompt text is kept in memory.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};

use serde_json::Value;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::types::{ChatRequest, ContentPart, FinishReason, RawJson, ResponseFormat, ToolCall, ToolChoice, Usage};

/// A complete answer as it was served.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAnswer {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish: FinishReason,
    pub usage: Option<Usage>,
    /// The route that generated it.
    pub served_by: String,
}

impl CachedAnswer {
    /// Bytes held for this answer (text and tool calls).
    pub fn size(&self) -> usize {
        self.text.len()
            + self.served_by.len()
            + self
                .tool_calls
                .iter()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                .sum::<usize>()
    }
}

/// Why `put` did not store an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    Disabled,
    /// Larger than `max_answer_bytes`.
    TooLarge,
    /// Truncated or filtered: not a complete answer.
    Incomplete,
}

struct Entry {
    answer: CachedAnswer,
    expires: Instant,
    tick: u64,
}

/// Bounded map from normalised request to answer, least recently used evicted first.
pub struct AnswerCache {
    cfg: CacheConfig,
    seeds: (RandomState, RandomState),
    entries: HashMap<u128, Entry>,
    order: BTreeMap<u64, u128>,
    next_tick: u64,
}

impl AnswerCache {
    pub fn new(cfg: CacheConfig) -> Self {
        AnswerCache {
            cfg,
            seeds: (RandomState::new(), RandomState::new()),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_tick: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The stored answer for `req` in `scope` (the tenant: tenants never share answers), if
    /// one is fresh.
    pub fn get(&mut self, scope: &str, req: &ChatRequest, now: Instant) -> Option<CachedAnswer> {
        if !self.cfg.enabled {
            return None;
        }
        let key = self.key(scope, req);
        let expired = self.entries.get(&key)?.expires <= now;
        if expired {
            self.remove(key);
            return None;
        }
        let tick = self.tick();
        let entry = self.entries.get_mut(&key)?;
        self.order.remove(&entry.tick);
        entry.tick = tick;
        self.order.insert(tick, key);
        Some(entry.answer.clone())
    }

    /// Stores `answer` for `req` in `scope` (replacing any older one).
    pub fn put(&mut self, scope: &str, req: &ChatRequest, answer: CachedAnswer, now: Instant) -> Result<(), NotStored> {
        if !self.cfg.enabled {
            return Err(NotStored::Disabled);
        }
        if matches!(answer.finish, FinishReason::Truncated | FinishReason::ContentFilter) {
            return Err(NotStored::Incomplete);
        }
        if answer.size() > self.cfg.max_answer_bytes {
            return Err(NotStored::TooLarge);
        }
        let key = self.key(scope, req);
        self.remove(key);
        let tick = self.tick();
        self.entries.insert(
            key,
            Entry {
                answer,
                expires: now + self.cfg.ttl,
                tick,
            },
        );
        self.order.insert(tick, key);
        while self.entries.len() > self.cfg.max_entries {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        Ok(())
    }

    fn tick(&mut self) -> u64 {
        self.next_tick += 1;
        self.next_tick
    }

    fn remove(&mut self, key: u128) {
        if let Some(e) = self.entries.remove(&key) {
            self.order.remove(&e.tick);
        }
    }

    fn key(&self, scope: &str, req: &ChatRequest) -> u128 {
        let mut a = self.seeds.0.build_hasher();
        let mut b = self.seeds.1.build_hasher();
        scope.hash(&mut a);
        scope.hash(&mut b);
        normalise(req, &mut a);
        normalise(req, &mut b);
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    }
}

/// Feeds the answer-shaping parts of `req` to `h`, in a fixed order with length prefixes.
fn normalise(req: &ChatRequest, h: &mut impl Hasher) {
    req.model.hash(h);
    h.write_usize(req.messages.len());
    for m in &req.messages {
        h.write_u8(m.role as u8);
        h.write_usize(m.content.len());
        for part in &m.content {
            match part {
                ContentPart::Text(t) => (0u8, t.trim()).hash(h),
                ContentPart::ImageUrl { url } => (1u8, url.as_str()).hash(h),
                ContentPart::Opaque { kind, .. } => (2u8, kind.as_str()).hash(h),
            }
        }
        // A part tailcut does not read is known only by its message's own JSON.
        if m.opaque_parts().next().is_some() {
            m.json
                .as_ref()
                .and_then(|j| j.in_wire(j.wire()?))
                .map(RawJson::text)
                .hash(h);
        }
        h.write_usize(m.tool_calls.len());
        for c in &m.tool_calls {
            (&c.id, &c.name).hash(h);
            json_text(&c.arguments, h);
        }
        (&m.tool_call_id, &m.name).hash(h);
    }
    h.write_usize(req.tools.len());
    for t in &req.tools {
        (&t.name, t.description.as_deref().map(str::trim)).hash(h);
        json(&t.parameters, h);
    }
    match &req.tool_choice {
        None => h.write_u8(0),
        Some(ToolChoice::Auto) => h.write_u8(1),
        Some(ToolChoice::None) => h.write_u8(2),
        Some(ToolChoice::Required) => h.write_u8(3),
        Some(ToolChoice::Tool(name)) => (4u8, name).hash(h),
    }
    match &req.response_format {
        None => h.write_u8(0),
        Some(ResponseFormat::Text) => h.write_u8(1),
        Some(ResponseFormat::JsonObject) => h.write_u8(2),
        Some(ResponseFormat::JsonSchema { name, schema, strict }) => {
            (3u8, name, strict).hash(h);
            json(schema, h);
        }
    }
    let s = &req.sampling;
    for f in [s.temperature, s.top_p, s.presence_penalty, s.frequency_penalty] {
        f.map(f64::to_bits).hash(h);
    }
    (&s.stop, s.seed, req.max_tokens).hash(h);
    // The client's own fields reach a route of its wire as sent (`logprobs`, `thinking`,
    // `reasoning_effort`, ...): each may shape the answer. Messages are hashed above, and
    // how the answer is streamed shapes nothing.
    if let Some(v) = &req.verbatim {
        v.wire.hash(h);
        for (name, value) in v.fields.iter().filter(|(name, _)| !UNSHAPING.contains(&&**name)) {
            (&**name, value.text()).hash(h);
        }
    }
}

/// Top-level fields that do not shape an answer's content, or are hashed as typed.
const UNSHAPING: [&str; 5] = ["messages", "system", "stream", "stream_options", "model"];

/// Tool-call arguments as JSON when they parse (so key order and spacing do not matter).
fn json_text(text: &str, h: &mut impl Hasher) {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => json(&v, h),
        Err(_) => (9u8, text.trim()).hash(h),
    }
}

/// A JSON value with object keys in sorted order, whatever the map's own order.
fn json(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(a) => {
            (4u8, a.len()).hash(h);
            a.iter().for_each(|x| json(x, h));
        }
        Value::Object(o) => {
            (5u8, o.len()).hash(h);
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            for k in keys {
                k.hash(h);
                json(&o[k.as_str()], h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::types::{Message, Role, ToolSpec};

    fn cache(max_entries: usize) -> AnswerCache {
        AnswerCache::new(CacheConfig {
            enabled: true,
            max_entries,
            ttl: Duration::from_secs(300),
            max_answer_bytes: 1_000,
        })
    }

    fn req(text: &str) -> ChatRequest {
        ChatRequest {
            model: "chat".into(),
            messages: vec![Message::text(Role::User, text)],
            ..ChatRequest::default()
        }
    }

    fn answer(text: &str) -> CachedAnswer {
        CachedAnswer {
            text: text.into(),
            tool_calls: Vec::new(),
            finish: FinishReason::Stop,
            usage: Some(Usage::new(3, 5)),
            served_by: "eu-a".into(),
        }
    }

    #[test]
    fn identical_request_hits_and_a_different_one_misses() {
        let mut c = cache(10);
        let now = Instant::now();
        c.put("", &req("capital of France?"), answer("Paris"), now)
            .expect("stored");
        assert_eq!(
            c.get("", &req("capital of France?"), now).map(|a| a.text),
            Some("Paris".into()),
            "exact match hits"
        );
        assert_eq!(
            c.get("", &req("capital of Spain?"), now),
            None,
            "another question misses"
        );
        let mut hot = req("capital of France?");
        hot.sampling.temperature = Some(1.5);
        assert_eq!(c.get("", &hot, now), None, "sampling is part of the key");
    }

    #[test]
    fn surrounding_whitespace_metadata_and_transport_flags_do_not_change_the_key() {
        let mut c = cache(10);
        let now = Instant::now();
        c.put("", &req("hello"), answer("hi"), now).expect("stored");
        let mut same = req("  hello\n");
        same.stream = true;
        same.include_usage = true;
        same.metadata.insert("user".into(), "u1".into());
        assert!(c.get("", &same, now).is_some(), "normalised away");
    }

    #[test]
    fn tool_schemas_match_whatever_their_key_order() {
        let mut c = cache(10);
        let now = Instant::now();
        let with_tool = |params: &str| {
            let mut r = req("weather?");
            let parameters = serde_json::from_str(params).expect("test JSON");
            r.tools.push(ToolSpec {
                name: "weather".into(),
                description: None,
                parameters,
            });
            r
        };
        c.put(
            "",
            &with_tool(r#"{"type":"object","required":["city"]}"#),
            answer("sunny"),
            now,
        )
        .expect("stored");
        assert!(
            c.get("", &with_tool(r#"{"required":["city"],"type":"object"}"#), now)
                .is_some(),
            "same schema"
        );
        assert!(
            c.get("", &with_tool(r#"{"type":"object"}"#), now).is_none(),
            "different schema"
        );
        assert!(c.get("", &req("weather?"), now).is_none(), "tools are part of the key");
    }

    #[test]
    fn entries_expire_after_the_ttl() {
        let mut c = cache(10);
        let now = Instant::now();
        c.put("", &req("q"), answer("a"), now).expect("stored");
        assert!(
            c.get("", &req("q"), now + Duration::from_secs(299)).is_some(),
            "fresh within the TTL"
        );
        assert!(
            c.get("", &req("q"), now + Duration::from_secs(300)).is_none(),
            "stale at the TTL"
        );
        assert!(c.is_empty(), "a stale entry is dropped when found");
    }

    #[test]
    fn least_recently_used_entry_is_evicted_at_capacity() {
        let mut c = cache(2);
        let now = Instant::now();
        c.put("", &req("one"), answer("1"), now).expect("stored");
        c.put("", &req("two"), answer("2"), now).expect("stored");
        assert!(c.get("", &req("one"), now).is_some(), "touch one");
        c.put("", &req("three"), answer("3"), now).expect("stored");
        assert_eq!(c.len(), 2, "bounded");
        assert!(c.get("", &req("two"), now).is_none(), "two was least recently used");
        assert!(c.get("", &req("one"), now).is_some() && c.get("", &req("three"), now).is_some());
    }

    #[test]
    fn oversized_incomplete_and_disabled_answers_are_not_stored() {
        let mut c = cache(10);
        let now = Instant::now();
        assert_eq!(
            c.put("", &req("q"), answer(&"x".repeat(2_000)), now),
            Err(NotStored::TooLarge)
        );
        let partial = CachedAnswer {
            finish: FinishReason::Truncated,
            ..answer("half")
        };
        assert_eq!(c.put("", &req("q"), partial, now), Err(NotStored::Incomplete));
        let mut off = AnswerCache::new(CacheConfig::default());
        assert!(!off.enabled(), "the cache is opt-in");
        assert_eq!(off.put("", &req("q"), answer("a"), now), Err(NotStored::Disabled));
        assert_eq!(off.get("", &req("q"), now), None);
    }

    #[test]
    fn tool_calls_and_usage_round_trip() {
        let mut c = cache(10);
        let now = Instant::now();
        let call = ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "weather".into(),
            arguments: r#"{"city":"Oslo"}"#.into(),
        };
        let stored = CachedAnswer {
            tool_calls: vec![call],
            finish: FinishReason::ToolCalls,
            ..answer("")
        };
        c.put("", &req("weather in Oslo"), stored.clone(), now).expect("stored");
        assert_eq!(
            c.get("", &req("weather in Oslo"), now),
            Some(stored),
            "served exactly as stored"
        );
    }
}
