//! Anthropic prompt caching as the simulator plays it: the prefix a request's `cache_control`
//! breakpoints mark, and a bounded memory of the prefixes already seen, so the usage says
//! what the real API would bill.
//!
//! The prefix is read in the API's order, `tools` → `system` → `messages`, up to each block
//! carrying `cache_control` (a top-level `cache_control`, automatic caching, marks the last
//! message block). A breakpoint's prefix seen before (on this simulator, for the same
//! scenario and model) is read from the cache; the rest up to the last breakpoint is written:
//! `cache_read_input_tokens` and `cache_creation_input_tokens`, and `input_tokens` counts only
//! what follows the last breakpoint, as the real API does. Tokens are the simulator's input
//! estimate (words of the text blocks; tool definitions cost none). Known limits: no minimum
//! cacheable length, no TTL (an entry lives until 1,024 newer prefixes push it out), no
//! 20-block lookback, and an entry is readable as soon as its request is answered.

use std::collections::{HashSet, VecDeque};

use parking_lot::Mutex;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::answer::estimate_tokens;

/// Prefixes remembered; the oldest is forgotten first.
const CAPACITY: usize = 1024;

type Key = [u8; 32];

/// What one request's input did with the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheUse {
    /// `cache_creation_input_tokens`: written now.
    pub creation: u32,
    /// `cache_read_input_tokens`: read from an earlier request.
    pub read: u32,
}

/// The prefix up to one breakpoint: its hash and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Breakpoint {
    key: Key,
    tokens: u32,
}

/// The prefixes seen recently, shared by every request of one simulator.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    keys: HashSet<Key>,
    order: VecDeque<Key>,
}

impl PromptCache {
    /// The cache use of a request with `input_tokens` of input, and the input left uncached.
    /// `scope` (scenario and model) keeps one upstream's entries from another's.
    pub fn charge(&self, scope: &str, body: &Value, input_tokens: u32) -> (CacheUse, u32) {
        let points = breakpoints(scope, body);
        let Some(last) = points.last() else {
            return (CacheUse::default(), input_tokens);
        };
        let cached = last.tokens.min(input_tokens);
        let mut seen = self.seen.lock();
        let read = points
            .iter()
            .rev()
            .find(|p| seen.keys.contains(&p.key))
            .map_or(0, |p| p.tokens.min(cached));
        for point in &points {
            seen.remember(point.key);
        }
        let used = CacheUse {
            creation: cached - read,
            read,
        };
        (used, input_tokens - cached)
    }
}

impl Seen {
    fn remember(&mut self, key: Key) {
        if !self.keys.insert(key) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }
}

/// How many `cache_control` markers the request carries (the top-level one included): the
/// real API takes at most 4.
pub(crate) fn markers(body: &Value) -> usize {
    let blocks = walk(body).iter().filter(|b| b.marked).count();
    blocks + usize::from(top_level(body))
}

fn top_level(body: &Value) -> bool {
    body.get("cache_control").is_some_and(Value::is_object)
}

/// One block of the prefix, in the order the API reads them.
struct Block<'a> {
    /// Where it sits ("tools", "system", or the message's index and role).
    place: String,
    value: &'a Value,
    marked: bool,
    tokens: u32,
}

fn walk(body: &Value) -> Vec<Block<'_>> {
    let mut blocks = Vec::new();
    let list = |key: &str| body.get(key).and_then(Value::as_array).into_iter().flatten();
    for tool in list("tools") {
        blocks.push(block("tools".to_owned(), tool, 0));
    }
    match body.get("system") {
        Some(Value::Array(parts)) => {
            for part in parts {
                blocks.push(block("system".to_owned(), part, text_tokens(part)));
            }
        }
        Some(system @ Value::String(s)) => blocks.push(block("system".to_owned(), system, estimate_tokens(s))),
        _ => {}
    }
    for (n, message) in list("messages").enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        let place = format!("messages.{n}.{role}");
        match message.get("content") {
            Some(Value::Array(parts)) => {
                for part in parts {
                    blocks.push(block(place.clone(), part, text_tokens(part)));
                }
            }
            Some(content @ Value::String(s)) => blocks.push(block(place, content, estimate_tokens(s))),
            _ => {}
        }
    }
    blocks
}

fn block(place: String, value: &Value, tokens: u32) -> Block<'_> {
    let marked = value.get("cache_control").is_some_and(Value::is_object);
    Block {
        place,
        value,
        marked,
        tokens,
    }
}

fn text_tokens(part: &Value) -> u32 {
    part.get("text").and_then(Value::as_str).map_or(0, estimate_tokens)
}

/// The request's breakpoints in order, each with the hash of everything up to it.
fn breakpoints(scope: &str, body: &Value) -> Vec<Breakpoint> {
    let blocks = walk(body);
    let automatic = top_level(body).then(|| blocks.len().saturating_sub(1));
    let mut hash = Sha256::new();
    hash.update(scope.as_bytes());
    let mut tokens = 0u32;
    let mut points = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        hash.update([0]);
        hash.update(b.place.as_bytes());
        hash.update([0]);
        hash.update(without_cache_control(b.value).as_bytes());
        tokens = tokens.saturating_add(b.tokens);
        if b.marked || automatic == Some(i) {
            points.push(Breakpoint {
                key: hash.clone().finalize().into(),
                tokens,
            });
        }
    }
    points
}

/// The block as JSON with its `cache_control` left out: moving a breakpoint does not change
/// the content before it.
fn without_cache_control(value: &Value) -> String {
    match value {
        Value::Object(map) if map.contains_key("cache_control") => {
            let mut map = map.clone();
            map.remove("cache_control");
            Value::Object(map).to_string()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(question: &str) -> Value {
        json!({
            "system": [{"type": "text", "text": "You answer questions about a long manual", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}]
        })
    }

    #[test]
    fn a_prefix_is_written_once_then_read_and_input_counts_only_the_rest() {
        let cache = PromptCache::default();
        let (first, input) = cache.charge("s/m", &body("what is on page two"), 12);
        assert_eq!(first, CacheUse { creation: 7, read: 0 }, "the system prompt is written");
        assert_eq!(input, 5, "input_tokens counts only the uncached rest");
        let (again, input) = cache.charge("s/m", &body("and page three"), 10);
        assert_eq!(again, CacheUse { creation: 0, read: 7 }, "then read");
        assert_eq!(input, 3, "the new question");
        let (other, _) = cache.charge("s/other-model", &body("and page three"), 10);
        assert_eq!(other.read, 0, "another model has its own cache");
    }

    #[test]
    fn a_longer_breakpoint_reads_the_shorter_one_and_writes_the_difference() {
        let cache = PromptCache::default();
        cache.charge("s", &body("one two"), 9);
        let mut longer = body("one two");
        longer["messages"][0]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        if let Some(messages) = longer["messages"].as_array_mut() {
            messages.push(json!({"role": "user", "content": "three"}));
        }
        let (used, input) = cache.charge("s", &longer, 10);
        assert_eq!(
            used,
            CacheUse { creation: 2, read: 7 },
            "read up to the system, write the question"
        );
        assert_eq!(input, 1, "the last message");
    }

    #[test]
    fn without_cache_control_nothing_is_cached_and_automatic_caching_marks_the_last_block() {
        let cache = PromptCache::default();
        let plain = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi there"}]});
        assert_eq!(cache.charge("s", &plain, 4), (CacheUse::default(), 4), "no breakpoint");
        assert_eq!(markers(&plain), 0);
        let mut automatic = plain.clone();
        automatic["cache_control"] = json!({"type": "ephemeral"});
        assert_eq!(markers(&automatic), 1, "the top level takes a slot");
        let (used, input) = cache.charge("s", &automatic, 4);
        assert_eq!((used.creation, input), (4, 0), "the whole prompt is written");
        assert_eq!(cache.charge("s", &automatic, 4).0.read, 4, "and read next time");
    }

    #[test]
    fn the_memory_is_bounded_and_forgets_the_oldest() {
        let cache = PromptCache::default();
        cache.charge("s", &body("first"), 8);
        for n in 0..CAPACITY {
            cache.charge(&format!("other-{n}"), &body("x"), 8);
        }
        assert_eq!(cache.seen.lock().keys.len(), CAPACITY, "bounded");
        assert_eq!(
            cache.charge("s", &body("first"), 8).0.read,
            0,
            "the oldest was forgotten"
        );
    }
}
