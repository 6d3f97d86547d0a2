//! Tool-call assembly: buffers tool-call fragments per call and hands out only whole,
//! validated calls, so a partial tool call never leaves the mux. Beside it, the same hold
//! for a structured answer (`structured`), and what an answer that failed either gate said,
//! kept for its repair (`rejected`), and both compiled once per request for all its attempts
//! (`gates`), their patterns within the request's budget (`pattern_budget`). Why calls are refused, and whether the route is to blame, is `error`.
//!
//! # Why
//! Upstreams stream a tool call's arguments as raw string fragments cut anywhere, even
//! inside a JSON escape (wire-formats T4). A client that receives half a call may act on
//! it. So nothing of a call is emitted until the upstream says it is complete *and* its
//! arguments parse as a JSON object (and match the tool's schema when the request gave
//! one). Calls leave all together, at the answer's terminal signal, in index order.
//!
//! # Rules
//! - Fragments are keyed by their `index` alone, never by `id` (T1-T3). `id` and `name`
//!   are taken from the first fragment that carries them.
//! - A fragment whose non-null `id` differs from the call already at its index starts a
//!   new call (servers that send every call as index 0, T3); it is ordered after the
//!   earlier call at that index.
//! - Argument fragments are concatenated as strings and parsed once, at completion (T4,
//!   T6): [`ToolCallAssembler::end`] for a per-call signal (Anthropic `content_block_stop`)
//!   or [`ToolCallAssembler::finish`] for the answer's terminal signal. Empty arguments
//!   read as `{}`.
//! - `finish` with a reason other than `tool_calls` or `stop` while a call is still open
//!   is [`AssemblerError::Incomplete`]: the answer was cut inside that call (T7).
//! - A call naming a tool the request did not offer is [`AssemblerError::UnknownTool`],
//!   also when it offered none (a request's gates, `Gates::compile`); only an assembler
//!   made by `new(&[])`, bound to no request, takes any name.
//! - Buffered bytes (arguments, ids, names) and the number of calls are capped.
//! - A call without an upstream id gets `call_<uuid>`. Emitted calls are numbered 0.. in
//!   emission order, whatever indexes the upstream used.
//! - The first error is sticky: every later call returns it until [`ToolCallAssembler::reset`].
//!
//! # Known limits
//! The assembler cannot know about calls an upstream never started: if a stream loses a
//! whole call and still ends with `tool_calls`, the calls it did see are returned. Streams
//! that end without their terminal signal are the mux's to reject (T11), and then
//! `finish` is never called. Likewise an upstream that sends a call's first fragment and
//! then claims `tool_calls` gets that call with `{}` arguments.

mod error;
mod gates;
mod pattern_budget;
mod rejected;
mod schema;
mod structured;
mod unsatisfiable;

use std::collections::HashMap;
use std::sync::Arc;

use self::schema::{parse_object, ToolSchemas};
use crate::provider::ToolFragment;
use crate::types::{FinishReason, ToolCall, ToolSpec};

pub use self::error::AssemblerError;
pub use self::gates::Gates;
pub use self::pattern_budget::{count_patterns, PatternBudget, SchemaRefusal, MIN_PATTERN_SIZE, PATTERN_BUDGET};
pub use self::rejected::{Rejected, RejectedCall, MAX_ECHO_BYTES};
pub use self::structured::{StructuredError, StructuredGate, MAX_HELD_BYTES};

/// Cap on buffered argument, id and name bytes across one answer's calls.
pub const MAX_BUFFERED_BYTES: usize = 1 << 20;
/// Cap on the number of tool calls in one answer.
pub const MAX_CALLS: usize = 128;

#[derive(Debug, Clone)]
struct PendingCall {
    /// The upstream's index for this call (not unique when a server reuses index 0).
    index: u32,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
    /// Completed and validated; no more fragments may arrive.
    ended: bool,
}

/// Buffers one answer's tool-call fragments; see the module doc. Cloning is cheap (the
/// compiled schemas are shared), so one compiled set can serve every attempt of a request.
#[derive(Debug, Clone)]
pub struct ToolCallAssembler {
    schemas: Arc<ToolSchemas>,
    /// Calls in the order their first fragment arrived.
    calls: Vec<PendingCall>,
    /// Upstream index -> the latest call at that index.
    by_index: HashMap<u32, usize>,
    buffered_bytes: usize,
    max_bytes: usize,
    failed: Option<AssemblerError>,
    /// The request's `tool_choice` as a limit on names: `none` allows no call, a forced tool
    /// only that one (`None`: any offered tool).
    chosen: Option<Chosen>,
}

/// What a request's `tool_choice` leaves callable.
#[derive(Debug, Clone, PartialEq)]
enum Chosen {
    Nothing,
    Only(Arc<str>),
}

impl ToolCallAssembler {
    /// Compiles each tool's JSON Schema once. A tool whose schema is null, or does not
    /// compile (including remote `$ref`s, which are never fetched), is validated as
    /// "any JSON object".
    pub fn new(tools: &[ToolSpec]) -> Self {
        ToolCallAssembler::over(ToolSchemas::compile(tools))
    }

    /// An assembler judging calls by `schemas`, compiled already (`Gates::compile`).
    fn over(schemas: ToolSchemas) -> Self {
        ToolCallAssembler {
            schemas: Arc::new(schemas),
            calls: Vec::new(),
            by_index: HashMap::new(),
            buffered_bytes: 0,
            max_bytes: MAX_BUFFERED_BYTES,
            failed: None,
            chosen: None,
        }
    }

    /// Holds calls to the request's `tool_choice`: with `none` every call, with a forced tool
    /// a call to any other, is [`AssemblerError::NotChosen`].
    fn with_choice(mut self, choice: Option<&crate::types::ToolChoice>) -> Self {
        use crate::types::ToolChoice;
        self.chosen = match choice {
            Some(ToolChoice::None) => Some(Chosen::Nothing),
            Some(ToolChoice::Tool(name)) => Some(Chosen::Only(Arc::from(name.as_str()))),
            _ => None,
        };
        self
    }

    /// Replaces the cap on buffered bytes (default [`MAX_BUFFERED_BYTES`]).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Buffers one fragment. Returns `true` when it started a new call: the commit point
    /// for an answer that opens with a tool call.
    pub fn push(&mut self, frag: ToolFragment) -> Result<bool, AssemblerError> {
        self.check_failed()?;
        let result = self.accept(frag);
        self.remember(result)
    }

    /// The upstream says call `index` is complete: validate it now. An index with no
    /// call, or one already ended, is ignored.
    pub fn end(&mut self, index: u32) -> Result<(), AssemblerError> {
        self.check_failed()?;
        let Some(&slot) = self.by_index.get(&index) else {
            return Ok(());
        };
        let result = self.complete(slot);
        self.remember(result)
    }

    /// The answer's terminal signal. With `tool_calls` or `stop`, open calls are complete
    /// now; with any other reason an open call is [`AssemblerError::Incomplete`]. Returns
    /// every call, validated and whole, in index order (empty when there were none).
    pub fn finish(&mut self, reason: FinishReason) -> Result<Vec<ToolCall>, AssemblerError> {
        self.check_failed()?;
        let result = self.complete_all(reason);
        self.remember(result)
    }

    /// A call has started and not yet been completed.
    pub fn has_open_call(&self) -> bool {
        self.calls.iter().any(|call| !call.ended)
    }

    /// How many calls have started.
    pub fn started(&self) -> usize {
        self.calls.len()
    }

    /// Every call as buffered so far, valid or not, in the order they started: what a
    /// rejected answer said, for its repair.
    pub fn rejected_calls(&self) -> Vec<RejectedCall> {
        self.calls
            .iter()
            .map(|c| RejectedCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect()
    }

    /// Forgets every call and error, keeping the compiled schemas (for the next attempt).
    pub fn reset(&mut self) {
        self.calls.clear();
        self.by_index.clear();
        self.buffered_bytes = 0;
        self.failed = None;
    }

    fn accept(&mut self, frag: ToolFragment) -> Result<bool, AssemblerError> {
        let ToolFragment {
            index,
            id,
            name,
            arguments,
        } = frag;
        let id = id.filter(|id| !id.is_empty());
        let name = name.filter(|name| !name.is_empty());
        let bytes = arguments.len() + id.as_ref().map_or(0, String::len) + name.as_ref().map_or(0, String::len);
        self.charge(bytes)?;

        let current = self.by_index.get(&index).copied();
        let continues = current.filter(|&slot| !starts_new_call(&self.calls[slot], id.as_deref()));
        let (slot, started) = match continues {
            Some(slot) => (slot, false),
            // A fragment that carries nothing does not start a call.
            None if id.is_none() && name.is_none() && arguments.is_empty() => return Ok(false),
            None => (self.start_call(index)?, true),
        };

        let call = &mut self.calls[slot];
        if call.ended {
            if arguments.is_empty() {
                return Ok(false);
            }
            return Err(AssemblerError::FragmentAfterEnd { index });
        }
        if call.id.is_none() {
            call.id = id;
        }
        if call.name.is_none() {
            call.name = name;
        }
        call.arguments.push_str(&arguments);
        Ok(started)
    }

    fn start_call(&mut self, index: u32) -> Result<usize, AssemblerError> {
        if self.calls.len() >= MAX_CALLS {
            return Err(AssemblerError::TooLarge {
                what: "tool calls",
                limit: MAX_CALLS,
            });
        }
        self.calls.push(PendingCall {
            index,
            id: None,
            name: None,
            arguments: String::new(),
            ended: false,
        });
        let slot = self.calls.len() - 1;
        self.by_index.insert(index, slot);
        Ok(slot)
    }

    fn charge(&mut self, bytes: usize) -> Result<(), AssemblerError> {
        let total = self.buffered_bytes.saturating_add(bytes);
        if total > self.max_bytes {
            return Err(AssemblerError::TooLarge {
                what: "buffered bytes",
                limit: self.max_bytes,
            });
        }
        self.buffered_bytes = total;
        Ok(())
    }

    fn complete_all(&mut self, reason: FinishReason) -> Result<Vec<ToolCall>, AssemblerError> {
        let open_calls_complete = matches!(reason, FinishReason::ToolCalls | FinishReason::Stop);
        let mut order: Vec<usize> = (0..self.calls.len()).collect();
        // Stable: calls sharing an index keep their arrival order.
        order.sort_by_key(|&slot| self.calls[slot].index);

        for &slot in &order {
            let call = &self.calls[slot];
            if call.ended {
                continue;
            }
            if !open_calls_complete {
                return Err(AssemblerError::Incomplete {
                    index: call.index,
                    name: call.name.clone(),
                    reason,
                });
            }
            self.complete(slot)?;
        }

        let mut out = Vec::with_capacity(order.len());
        for (position, slot) in order.into_iter().enumerate() {
            let call = &self.calls[slot];
            out.push(ToolCall {
                index: u32::try_from(position).unwrap_or(u32::MAX),
                id: call.id.clone().unwrap_or_default(),
                name: call.name.clone().unwrap_or_default(),
                arguments: call.arguments.clone(),
            });
        }
        Ok(out)
    }

    /// Validates call `slot` and marks it ended. On success its arguments are final
    /// (`""` becomes `{}`) and it has an id.
    fn complete(&mut self, slot: usize) -> Result<(), AssemblerError> {
        let Some(call) = self.calls.get(slot) else {
            return Ok(());
        };
        if call.ended {
            return Ok(());
        }
        let index = call.index;
        let Some(name) = call.name.as_deref() else {
            return Err(AssemblerError::MissingName { index });
        };
        let allowed = match &self.chosen {
            None => true,
            Some(Chosen::Nothing) => false,
            Some(Chosen::Only(only)) => **only == *name,
        };
        if !allowed {
            return Err(AssemblerError::NotChosen {
                index,
                name: name.to_string(),
            });
        }
        let Some(schema) = self.schemas.lookup(name) else {
            return Err(AssemblerError::UnknownTool {
                index,
                name: name.to_string(),
            });
        };
        let value = parse_object(&call.arguments).map_err(|message| AssemblerError::InvalidJson {
            index,
            name: name.to_string(),
            message,
        })?;
        schema.check(&value).map_err(|message| AssemblerError::SchemaMismatch {
            index,
            name: name.to_string(),
            message,
        })?;

        let empty = call.arguments.trim().is_empty();
        let call = &mut self.calls[slot];
        if empty {
            call.arguments = "{}".to_string();
        }
        call.id.get_or_insert_with(new_call_id);
        call.ended = true;
        Ok(())
    }

    fn check_failed(&self) -> Result<(), AssemblerError> {
        match &self.failed {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }

    fn remember<T>(&mut self, result: Result<T, AssemblerError>) -> Result<T, AssemblerError> {
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }
}

/// T3: a different non-null id at an index that already holds a call means a new call.
fn starts_new_call(current: &PendingCall, id: Option<&str>) -> bool {
    matches!((current.id.as_deref(), id), (Some(held), Some(new)) if held != new)
}

fn new_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::types::ErrorClass;

    fn tool(name: &str, parameters: Value) -> ToolSpec {
        ToolSpec {
            name: name.to_string(),
            description: None,
            parameters,
        }
    }

    fn weather_tools() -> Vec<ToolSpec> {
        vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            ),
            tool("get_stock_price", json!({"type": "object"})),
        ]
    }

    fn head(index: u32, id: &str, name: &str) -> ToolFragment {
        ToolFragment {
            index,
            id: Some(id.to_string()),
            name: Some(name.to_string()),
            arguments: String::new(),
        }
    }

    fn args(index: u32, arguments: &str) -> ToolFragment {
        ToolFragment {
            index,
            arguments: arguments.to_string(),
            ..ToolFragment::default()
        }
    }

    fn push_all(asm: &mut ToolCallAssembler, frags: Vec<ToolFragment>) {
        for frag in frags {
            let result = asm.push(frag.clone());
            assert!(result.is_ok(), "fragment {frag:?} accepted: {result:?}");
        }
    }

    fn only_call(calls: &[ToolCall]) -> &ToolCall {
        assert_eq!(calls.len(), 1, "exactly one call: {calls:?}");
        &calls[0]
    }

    #[test]
    fn reassembles_openai_parallel_calls_from_the_wire_capture() {
        let mut asm = ToolCallAssembler::new(&[]);
        let mut frags = vec![head(0, "call_JMW1", "GetWeatherArgs")];
        for piece in [
            "{\"ci", "ty\": ", "\"Edinb", "urgh", "\", \"c", "ountry", "\": \"", "GB\", ", "\"units", "\": \"", "c\"}",
        ] {
            frags.push(args(0, piece));
        }
        frags.push(head(1, "call_DNYT", "get_stock_price"));
        for piece in [
            "{\"ti", "cker\"", ": \"AAP", "L\", ", "\"exch", "ange\":", " \"NA", "SDAQ\"", "}",
        ] {
            frags.push(args(1, piece));
        }
        push_all(&mut asm, frags);
        let calls = asm.finish(FinishReason::ToolCalls);
        assert_eq!(
            calls,
            Ok(vec![
                ToolCall {
                    index: 0,
                    id: "call_JMW1".into(),
                    name: "GetWeatherArgs".into(),
                    arguments: r#"{"city": "Edinburgh", "country": "GB", "units": "c"}"#.into(),
                },
                ToolCall {
                    index: 1,
                    id: "call_DNYT".into(),
                    name: "get_stock_price".into(),
                    arguments: r#"{"ticker": "AAPL", "exchange": "NASDAQ"}"#.into(),
                },
            ]),
            "both calls whole, in index order"
        );
    }

    #[test]
    fn push_reports_the_start_of_each_call_once() {
        let mut asm = ToolCallAssembler::new(&[]);
        assert_eq!(asm.push(head(0, "a", "f")), Ok(true), "first fragment starts call 0");
        assert_eq!(asm.push(args(0, "{")), Ok(false), "continuation");
        assert_eq!(asm.push(head(1, "b", "g")), Ok(true), "first fragment starts call 1");
        assert_eq!(asm.push(args(0, "}")), Ok(false), "back to call 0");
        assert_eq!(asm.started(), 2, "two calls started");
        assert!(asm.has_open_call(), "both open until the terminal signal");
    }

    #[test]
    fn anthropic_call_is_validated_at_its_end_signal() {
        let mut asm = ToolCallAssembler::new(&weather_tools());
        push_all(
            &mut asm,
            vec![
                head(1, "toolu_01", "get_weather"),
                args(1, ""),
                args(1, "{\"city\":"),
                args(1, " \"San Francisco\"}"),
            ],
        );
        assert_eq!(asm.end(1), Ok(()), "complete and valid at content_block_stop");
        assert!(!asm.has_open_call(), "no open call after its end");
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        let call = only_call(&calls);
        assert_eq!(
            (call.index, call.id.as_str()),
            (0, "toolu_01"),
            "renumbered from 0, id kept"
        );
        assert_eq!(call.arguments, r#"{"city": "San Francisco"}"#, "raw arguments kept");
    }

    #[test]
    fn end_reports_invalid_json_at_once() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(1, "toolu_01", "f"), args(1, "{\"a\": ")]);
        let err = asm.end(1);
        assert!(
            matches!(err, Err(AssemblerError::InvalidJson { index: 1, .. })),
            "got {err:?}"
        );
    }

    #[test]
    fn fragments_are_keyed_by_index_not_id() {
        let mut asm = ToolCallAssembler::new(&[]);
        // Continuation fragments carry no id (T1); one even carries a stray id-less name.
        push_all(
            &mut asm,
            vec![
                head(0, "call_a", "f"),
                args(0, "{\"x\""),
                ToolFragment {
                    index: 0,
                    name: Some("f".into()),
                    arguments: ": 1}".into(),
                    ..ToolFragment::default()
                },
            ],
        );
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        assert_eq!(
            only_call(&calls).arguments,
            r#"{"x": 1}"#,
            "one call, arguments concatenated"
        );
    }

    #[test]
    fn the_same_id_again_continues_the_call() {
        let mut asm = ToolCallAssembler::new(&[]);
        assert_eq!(asm.push(head(0, "call_a", "f")), Ok(true), "start");
        let again = ToolFragment {
            arguments: "{}".into(),
            ..head(0, "call_a", "f")
        };
        assert_eq!(asm.push(again), Ok(false), "a repeated id is the same call");
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        assert_eq!(only_call(&calls).arguments, "{}", "one call");
    }

    #[test]
    fn a_different_id_at_the_same_index_starts_a_new_call() {
        // Servers that send every call as index 0 (T3).
        let mut asm = ToolCallAssembler::new(&[]);
        assert_eq!(asm.push(head(0, "call_a", "f")), Ok(true), "first call");
        push_all(&mut asm, vec![args(0, "{\"n\": 1}")]);
        assert_eq!(asm.push(head(0, "call_b", "g")), Ok(true), "a new id is a new call");
        push_all(&mut asm, vec![args(0, "{\"n\": 2}")]);
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        let summary: Vec<_> = calls
            .iter()
            .map(|c| (c.index, c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            summary,
            [(0, "call_a", "f", r#"{"n": 1}"#), (1, "call_b", "g", r#"{"n": 2}"#)],
            "two calls in arrival order"
        );
    }

    #[test]
    fn interleaved_calls_are_kept_apart() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![
                head(0, "a", "f"),
                head(1, "b", "g"),
                args(1, "{\"b\":"),
                args(0, "{\"a\":"),
                args(0, "1}"),
                args(1, "2}"),
            ],
        );
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        let arguments: Vec<_> = calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(
            arguments,
            [r#"{"a":1}"#, r#"{"b":2}"#],
            "each call got its own fragments"
        );
    }

    #[test]
    fn calls_are_emitted_in_index_order_and_renumbered() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![
                head(7, "late", "f"),
                args(7, "{}"),
                head(2, "early", "g"),
                args(2, "{}"),
            ],
        );
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        let order: Vec<_> = calls.iter().map(|c| (c.index, c.id.as_str())).collect();
        assert_eq!(order, [(0, "early"), (1, "late")], "upstream index order, numbered 0..");
    }

    #[test]
    fn empty_arguments_count_as_an_empty_object() {
        let mut asm = ToolCallAssembler::new(&[tool("ping", json!({"type": "object"}))]);
        push_all(&mut asm, vec![head(0, "call_p", "ping")]);
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        assert_eq!(only_call(&calls).arguments, "{}", "\"\" reads as {{}}");
    }

    #[test]
    fn length_while_a_call_is_open_is_incomplete() {
        // The Anthropic SDK fixture: max_tokens with no content_block_stop (T7, §3.9).
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![
                head(1, "toolu_01EK", "make_file"),
                args(1, ""),
                args(1, "{\"filename\": \"taxes.txt"),
                args(1, "\", \"lines_of_text\": [\n\"# GUIDE\",\n"),
                args(1, "\n\"Filing taxes"),
            ],
        );
        let err = asm.finish(FinishReason::Length);
        assert_eq!(
            err,
            Err(AssemblerError::Incomplete {
                index: 1,
                name: Some("make_file".into()),
                reason: FinishReason::Length
            }),
            "truncation is reported, never the fragment"
        );
    }

    #[test]
    fn length_with_complete_json_but_no_end_is_still_incomplete() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{}")]);
        let err = asm.finish(FinishReason::Length);
        assert!(
            matches!(err, Err(AssemblerError::Incomplete { .. })),
            "done is not valid: {err:?}"
        );
    }

    #[test]
    fn content_filter_while_a_call_is_open_is_incomplete() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{}")]);
        let err = asm.finish(FinishReason::ContentFilter);
        assert!(
            matches!(
                err,
                Err(AssemblerError::Incomplete {
                    reason: FinishReason::ContentFilter,
                    ..
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn length_after_every_call_ended_returns_them() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(1, "toolu_1", "f"), args(1, "{\"a\": 1}")]);
        assert_eq!(asm.end(1), Ok(()), "ended and valid");
        let calls = asm.finish(FinishReason::Length).unwrap_or_default();
        assert_eq!(
            only_call(&calls).arguments,
            r#"{"a": 1}"#,
            "a whole call survives later truncation"
        );
    }

    #[test]
    fn stop_completes_open_calls() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{}")]);
        let calls = asm.finish(FinishReason::Stop).unwrap_or_default();
        assert_eq!(only_call(&calls).id, "a", "stop counts as the completion signal");
    }

    #[test]
    fn truncated_arguments_at_finish_are_invalid_json() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{\"city\": \"Edin")]);
        let err = asm.finish(FinishReason::ToolCalls);
        assert!(
            matches!(err, Err(AssemblerError::InvalidJson { index: 0, .. })),
            "no partial call: {err:?}"
        );
    }

    #[test]
    fn arguments_must_be_an_object() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "[1, 2]")]);
        let err = asm.finish(FinishReason::ToolCalls);
        match err {
            Err(AssemblerError::InvalidJson { message, .. }) => {
                assert!(message.contains("an array"), "message names the kind: {message}")
            }
            other => panic!("expected InvalidJson, got {other:?}"),
        }
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let mut asm = ToolCallAssembler::new(&weather_tools());
        push_all(
            &mut asm,
            vec![head(0, "a", "get_weather"), args(0, "{\"town\": \"Leeds\"}")],
        );
        let err = asm.finish(FinishReason::ToolCalls);
        match err {
            Err(AssemblerError::SchemaMismatch {
                index: 0,
                name,
                message,
            }) => {
                assert_eq!(name, "get_weather", "names the tool");
                assert!(message.contains("city"), "says what is wrong: {message}");
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }

    #[test]
    fn a_tool_not_in_the_request_is_unknown() {
        let mut asm = ToolCallAssembler::new(&weather_tools());
        push_all(&mut asm, vec![head(0, "a", "rm_rf"), args(0, "{}")]);
        let err = asm.finish(FinishReason::ToolCalls);
        assert_eq!(
            err,
            Err(AssemblerError::UnknownTool {
                index: 0,
                name: "rm_rf".into()
            }),
            "unknown tool"
        );
    }

    #[test]
    fn without_request_tools_any_name_is_accepted() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(0, "a", "anything"), args(0, "{\"k\": [1]}")]);
        assert!(
            asm.finish(FinishReason::ToolCalls).is_ok(),
            "no tools given: names are not checked"
        );
    }

    #[test]
    fn an_uncompilable_schema_accepts_any_object() {
        let broken = tool("f", json!({"type": "no-such-type"}));
        let mut asm = ToolCallAssembler::new(&[broken]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{\"k\": 1}")]);
        assert!(
            asm.finish(FinishReason::ToolCalls).is_ok(),
            "validated as any JSON object"
        );
        asm.reset();
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "3")]);
        assert!(asm.finish(FinishReason::ToolCalls).is_err(), "but still an object");
    }

    #[test]
    fn a_null_schema_accepts_any_object() {
        let mut asm = ToolCallAssembler::new(&[tool("f", Value::Null)]);
        push_all(&mut asm, vec![head(0, "a", "f"), args(0, "{\"k\": 1}")]);
        assert!(asm.finish(FinishReason::ToolCalls).is_ok(), "no schema to check");
    }

    #[test]
    fn a_call_without_a_name_is_rejected() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![ToolFragment {
                index: 0,
                id: Some("a".into()),
                name: Some(String::new()),
                arguments: "{}".into(),
            }],
        );
        let err = asm.finish(FinishReason::ToolCalls);
        assert_eq!(
            err,
            Err(AssemblerError::MissingName { index: 0 }),
            "empty name is missing"
        );
    }

    #[test]
    fn a_name_on_a_later_fragment_is_adopted() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![
                args(0, "{"),
                ToolFragment {
                    index: 0,
                    name: Some("f".into()),
                    arguments: "}".into(),
                    ..ToolFragment::default()
                },
            ],
        );
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        assert_eq!(only_call(&calls).name, "f", "name from the first fragment that has one");
    }

    #[test]
    fn a_missing_id_is_generated() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(
            &mut asm,
            vec![ToolFragment {
                index: 0,
                id: None,
                name: Some("f".into()),
                arguments: "{}".into(),
            }],
        );
        let calls = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        let id = &only_call(&calls).id;
        assert!(
            id.starts_with("call_") && id.len() == 5 + 32,
            "generated call_<uuid>: {id}"
        );
        let again = asm.finish(FinishReason::ToolCalls).unwrap_or_default();
        assert_eq!(&only_call(&again).id, id, "the generated id is stable");
    }

    #[test]
    fn an_empty_fragment_does_not_start_a_call() {
        let mut asm = ToolCallAssembler::new(&[]);
        assert_eq!(asm.push(args(0, "")), Ok(false), "nothing to start");
        assert_eq!(asm.started(), 0, "no call");
        assert_eq!(asm.finish(FinishReason::Stop), Ok(vec![]), "no calls, no error");
    }

    #[test]
    fn arguments_after_a_call_ended_are_an_error() {
        let mut asm = ToolCallAssembler::new(&[]);
        push_all(&mut asm, vec![head(1, "a", "f"), args(1, "{}")]);
        assert_eq!(asm.end(1), Ok(()), "ended");
        assert_eq!(asm.push(args(1, "")), Ok(false), "an empty fragment is harmless");
        let err = asm.push(args(1, "{\"more\": 1}"));
        assert_eq!(
            err,
            Err(AssemblerError::FragmentAfterEnd { index: 1 }),
            "the ended call was not whole"
        );
    }

    #[test]
    fn buffered_bytes_are_capped() {
        let mut asm = ToolCallAssembler::new(&[]).with_max_bytes(16);
        assert_eq!(asm.push(head(0, "a", "f")), Ok(true), "two bytes buffered");
        let err = asm.push(args(0, "{\"k\": \"0123456789\"}"));
        assert_eq!(
            err,
            Err(AssemblerError::TooLarge {
                what: "buffered bytes",
                limit: 16
            }),
            "over the cap"
        );
    }

    #[test]
    fn the_number_of_calls_is_capped() {
        let mut asm = ToolCallAssembler::new(&[]);
        for i in 0..MAX_CALLS as u32 {
            assert_eq!(asm.push(head(i, &format!("c{i}"), "f")), Ok(true), "call {i} fits");
        }
        let err = asm.push(head(MAX_CALLS as u32, "one_more", "f"));
        assert!(
            matches!(err, Err(AssemblerError::TooLarge { what: "tool calls", .. })),
            "{err:?}"
        );
    }

    #[test]
    fn the_first_error_is_sticky_until_reset() {
        let mut asm = ToolCallAssembler::new(&weather_tools());
        push_all(&mut asm, vec![head(0, "a", "nope"), args(0, "{}")]);
        let first = asm.finish(FinishReason::ToolCalls);
        assert!(first.is_err(), "unknown tool");
        assert_eq!(
            asm.push(head(1, "b", "get_stock_price")),
            first.clone().map(|_| false),
            "later pushes repeat it"
        );
        assert_eq!(asm.finish(FinishReason::ToolCalls), first, "finish repeats it");
        asm.reset();
        assert_eq!(asm.started(), 0, "reset forgets the calls");
        push_all(&mut asm, vec![head(0, "a", "get_stock_price"), args(0, "{}")]);
        assert!(asm.finish(FinishReason::ToolCalls).is_ok(), "and the error");
    }

    #[test]
    fn a_clone_shares_schemas_but_not_calls() {
        let template = ToolCallAssembler::new(&weather_tools());
        let mut first = template.clone();
        push_all(&mut first, vec![head(0, "a", "get_weather")]);
        assert_eq!(template.started(), 0, "the template is untouched");
        let mut second = template.clone();
        push_all(&mut second, vec![head(0, "a", "get_weather"), args(0, "{}")]);
        assert!(
            matches!(
                second.finish(FinishReason::ToolCalls),
                Err(AssemblerError::SchemaMismatch { .. })
            ),
            "the clone validates with the compiled schema"
        );
    }

    #[test]
    fn long_validation_messages_are_clipped() {
        let long = "x".repeat(2000);
        let mut asm = ToolCallAssembler::new(&[tool(
            "f",
            json!({"type": "object", "properties": {"k": {"type": "integer"}}}),
        )]);
        push_all(
            &mut asm,
            vec![head(0, "a", "f"), args(0, &format!("{{\"k\": \"{long}\"}}"))],
        );
        match asm.finish(FinishReason::ToolCalls) {
            Err(AssemblerError::SchemaMismatch { message, .. }) => {
                assert!(
                    message.len() <= schema::MAX_MESSAGE_BYTES + '…'.len_utf8(),
                    "clipped to {} bytes",
                    message.len()
                )
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }

    #[test]
    fn every_error_is_invalid_output() {
        let errors = [
            AssemblerError::Incomplete {
                index: 0,
                name: None,
                reason: FinishReason::Length,
            },
            AssemblerError::InvalidJson {
                index: 0,
                name: "f".into(),
                message: String::new(),
            },
            AssemblerError::SchemaMismatch {
                index: 0,
                name: "f".into(),
                message: String::new(),
            },
            AssemblerError::UnknownTool {
                index: 0,
                name: "f".into(),
            },
            AssemblerError::TooLarge {
                what: "tool calls",
                limit: 1,
            },
            AssemblerError::MissingName { index: 0 },
            AssemblerError::FragmentAfterEnd { index: 0 },
        ];
        for err in errors {
            assert_eq!(err.class(), ErrorClass::InvalidOutput, "{err} is invalid output");
        }
    }
}

/// Property: whatever the fragmentation, interleaving and cut point, the assembler yields
/// the original calls byte for byte, or an error; never altered or partial arguments.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use proptest::sample::Index;
    use serde_json::{Map, Value};

    use super::*;

    const TOOL_NAMES: [&str; 3] = ["get_weather", "get_stock_price", "search"];

    #[derive(Debug, Clone)]
    struct Original {
        index: u32,
        id: Option<String>,
        name: String,
        arguments: String,
        /// The arguments in the order they are pushed (the first carries id and name).
        fragments: Vec<String>,
    }

    #[derive(Debug, Clone)]
    enum Event {
        Fragment { call: usize, fragment: ToolFragment },
        End { call: usize, index: u32 },
    }

    #[derive(Debug, Clone, Copy)]
    enum Ending {
        ToolCalls,
        Length,
        Nothing,
    }

    fn text() -> impl Strategy<Value = String> {
        let special = prop_oneof![
            Just('"'),
            Just('\\'),
            Just('\n'),
            Just('\t'),
            Just('\u{1}'),
            Just('/'),
            Just('é'),
            Just('😀'),
            Just(' '),
            Just('}'),
            Just('{'),
        ];
        prop::collection::vec(prop_oneof![3 => proptest::char::range('a', 'z'), 2 => special], 0..8)
            .prop_map(|chars| chars.into_iter().collect())
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1.0e9f64..1.0e9).prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text(), inner), 0..4)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    fn arguments() -> impl Strategy<Value = String> {
        (prop::collection::vec((text(), json_value()), 0..5), any::<bool>()).prop_map(|(pairs, pretty)| {
            let object = Value::Object(pairs.into_iter().collect());
            let rendered = if pretty {
                serde_json::to_string_pretty(&object)
            } else {
                serde_json::to_string(&object)
            };
            rendered.unwrap_or_else(|_| "{}".to_string())
        })
    }

    /// Splits `text` at arbitrary char boundaries (cuts may repeat: empty fragments).
    fn split(text: &str, cuts: &[Index], header_alone: bool) -> Vec<String> {
        let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let mut at: Vec<usize> = cuts.iter().map(|cut| boundaries[cut.index(boundaries.len())]).collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        if header_alone {
            pieces.push(String::new()); // T2: the first fragment's arguments are "".
        }
        let mut from = 0;
        for to in at.into_iter().chain([text.len()]) {
            pieces.push(text[from..to].to_string());
            from = to;
        }
        pieces
    }

    fn original() -> impl Strategy<Value = (String, Option<bool>, String, Vec<Index>, bool)> {
        (
            prop::sample::select(TOOL_NAMES.to_vec()).prop_map(str::to_string),
            prop::option::weighted(0.85, any::<bool>()),
            arguments(),
            prop::collection::vec(any::<Index>(), 0..8),
            any::<bool>(),
        )
    }

    /// Calls, their fragments interleaved (or sequential on index 0), optional end signals.
    fn scenario() -> impl Strategy<Value = (Vec<Original>, Vec<Event>)> {
        (
            prop::collection::vec(original(), 1..=3),
            0u32..=1,      // index base: 0 for OpenAI, 1 when a text block came first
            any::<bool>(), // every call on index 0, distinguished by id only (T3)
            any::<bool>(), // explicit end signal per call (Anthropic)
            any::<u64>(),  // interleaving seed
        )
            .prop_map(|(raw, base, all_zero, with_ends, seed)| {
                let calls: Vec<Original> = raw
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, has_id, arguments, cuts, header_alone))| Original {
                        index: if all_zero { 0 } else { base + i as u32 },
                        // Index-0 calls are told apart by id alone, so they always have one.
                        id: (has_id.is_some() || all_zero).then(|| format!("call_{i}")),
                        name,
                        fragments: split(&arguments, &cuts, header_alone),
                        arguments,
                    })
                    .collect();
                let events = interleave(&calls, !all_zero, with_ends, seed);
                (calls, events)
            })
    }

    fn interleave(calls: &[Original], shuffle: bool, with_ends: bool, mut seed: u64) -> Vec<Event> {
        let mut next = vec![0usize; calls.len()];
        let mut events = Vec::new();
        loop {
            let live: Vec<usize> = (0..calls.len())
                .filter(|&c| next[c] < calls[c].fragments.len())
                .collect();
            let Some(&first) = live.first() else { break };
            let call = if shuffle {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                live[(seed >> 33) as usize % live.len()]
            } else {
                first
            };
            let original = &calls[call];
            let position = next[call];
            let is_head = position == 0;
            events.push(Event::Fragment {
                call,
                fragment: ToolFragment {
                    index: original.index,
                    id: if is_head { original.id.clone() } else { None },
                    name: is_head.then(|| original.name.clone()),
                    arguments: original.fragments[position].clone(),
                },
            });
            next[call] += 1;
            if with_ends && next[call] == original.fragments.len() {
                events.push(Event::End {
                    call,
                    index: original.index,
                });
            }
        }
        events
    }

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

        #[test]
        fn never_a_partial_or_altered_tool_call(
            (calls, events) in scenario(),
            cut in any::<Index>(),
            ending in prop_oneof![Just(Ending::ToolCalls), Just(Ending::Length), Just(Ending::Nothing)],
            with_schemas in any::<bool>(),
        ) {
            let tools: Vec<ToolSpec> = if with_schemas {
                TOOL_NAMES
                    .iter()
                    .map(|name| ToolSpec { name: name.to_string(), description: None, parameters: serde_json::json!({"type": "object"}) })
                    .collect()
            } else {
                Vec::new()
            };
            let mut asm = ToolCallAssembler::new(&tools);
            let k = cut.index(events.len() + 1);
            let mut delivered = vec![String::new(); calls.len()];
            let mut started = vec![false; calls.len()];
            let mut ended = vec![false; calls.len()];
            for event in &events[..k] {
                match event {
                    Event::Fragment { call, fragment } => {
                        let result = asm.push(fragment.clone());
                        prop_assert!(result.is_ok(), "a valid stream's fragment is accepted: {:?}", result);
                        prop_assert_eq!(result.unwrap_or(false), !started[*call], "push reports exactly the starts");
                        started[*call] = true;
                        delivered[*call].push_str(&fragment.arguments);
                    }
                    Event::End { call, index } => {
                        let result = asm.end(*index);
                        prop_assert!(result.is_ok(), "a whole call validates at its end: {:?}", result);
                        ended[*call] = true;
                    }
                }
            }
            let cut_short = k < events.len();
            let open = (0..calls.len()).any(|c| started[c] && !ended[c]);
            prop_assert_eq!(asm.started(), started.iter().filter(|s| **s).count(), "started count");
            prop_assert_eq!(asm.has_open_call(), open, "open call tracking");

            let reason = match ending {
                Ending::Nothing => return Ok(()), // Nothing was finished, so nothing was emitted.
                Ending::ToolCalls => FinishReason::ToolCalls,
                Ending::Length => FinishReason::Length,
            };
            let result = asm.finish(reason);

            // What an honest assembler must answer, call by call.
            let partial = (0..calls.len()).any(|c| started[c] && !delivered[c].is_empty() && delivered[c] != calls[c].arguments);
            let must_fail = match ending {
                Ending::Length => open,
                _ => partial,
            };
            if must_fail {
                prop_assert!(result.is_err(), "a cut call must be an error, got {:?}", result);
                return Ok(());
            }
            let returned = match result {
                Ok(returned) => returned,
                Err(err) => return Err(TestCaseError::fail(format!("complete calls were refused: {err}"))),
            };
            let mut expected: Vec<&Original> = (0..calls.len()).filter(|&c| started[c]).map(|c| &calls[c]).collect();
            expected.sort_by_key(|call| call.index);
            prop_assert_eq!(returned.len(), expected.len(), "exactly the started calls");
            for (position, (call, original)) in returned.iter().zip(&expected).enumerate() {
                let c = calls.iter().position(|o| std::ptr::eq(o, *original)).unwrap_or(usize::MAX);
                prop_assert_eq!(call.index as usize, position, "renumbered 0..");
                prop_assert_eq!(&call.name, &original.name, "name kept");
                match &original.id {
                    Some(id) => prop_assert_eq!(&call.id, id, "upstream id kept"),
                    None => prop_assert!(call.id.starts_with("call_"), "generated id: {}", call.id),
                }
                if delivered[c].is_empty() {
                    // Upstream said the call was complete with no arguments: that reads as {}.
                    prop_assert_eq!(call.arguments.as_str(), "{}", "empty arguments read as {{}}");
                } else {
                    prop_assert_eq!(&call.arguments, &original.arguments, "arguments byte for byte");
                }
            }
            if !cut_short && matches!(ending, Ending::ToolCalls) {
                prop_assert_eq!(returned.len(), calls.len(), "an uncut stream yields every call");
            }
        }
    }
}
