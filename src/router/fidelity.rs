//! What a route of another wire would lose of a request: the client's own fields that the
//! typed view carries to no route of that wire. Each is either a reason the route is not
//! eligible (the answer depends on it) or dropped with a note in the envelope (`dropped`),
//! by the table below, which `docs/dialects.md` ("Cross wire") repeats for users.
//!
//! A route of the client's own wire loses nothing (same-wire pass-through), and a request
//! without the client's JSON (the native dialect) has nothing to lose.
//!
//! | client wire | field (or part) | to a route of the other wire |
//! |---|---|---|
//! | OpenAI | `logprobs: true`, `top_logprobs` | not eligible: no log-probabilities there |
//! | | `modalities` with `"audio"`, `audio` | not eligible: no audio output |
//! | | `input_audio` parts | not eligible: no audio input |
//! | | `file` parts (documents) | not eligible: not mapped to Anthropic documents yet |
//! | | `functions`, `function_call` (the deprecated form of tools) | not eligible: not mapped |
//! | | `user`, `parallel_tool_calls: false`, `reasoning_effort` (`ChatRequest::thinking_budget`) | mapped: `metadata.user_id`, `disable_parallel_tool_use`, a thinking budget (and then `temperature` other than 1 and `top_p` under 0.95 are dropped) |
//! | | every other field the typed view does not carry (`store`, `metadata`, `service_tier`, `prediction`, `seed`, the penalties, `logit_bias`, a `reasoning_effort` that cannot be mapped, ...) | dropped with a note |
//! | Anthropic | `thinking` (enabled or adaptive) | not eligible: no signed thinking blocks there |
//! | | `thinking` / `redacted_thinking` blocks in the history | not eligible: they must go back to Anthropic unchanged |
//! | | `document`, `search_result` blocks | not eligible: not mapped yet |
//! | | `mcp_servers`, `container` | not eligible: run by Anthropic itself |
//! | | `metadata.user_id` | mapped: `user` |
//! | | every other field the typed view does not carry (`top_k`, `service_tier`, ...) and `cache_control` anywhere | dropped with a note |

use crate::types::{ChatRequest, ModelRules, Verbatim, Wire, ANTHROPIC_DEFAULT_MAX_TOKENS};

/// The top-level fields each client wire's typed view carries to a route of the other wire
/// (mapped, `docs/dialects.md` "Cross-provider translation").
fn carried(wire: Wire) -> &'static [&'static str] {
    match wire {
        Wire::OpenAi => &[
            "model",
            "messages",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "stop",
            "tools",
            "tool_choice",
            "response_format",
            "n",
            // Mapped: `metadata.user_id`, `disable_parallel_tool_use`.
            "user",
            "parallel_tool_calls",
        ],
        Wire::Anthropic => &[
            "model",
            "messages",
            "system",
            "max_tokens",
            "stream",
            "temperature",
            "top_p",
            "stop_sequences",
            "tools",
            "tool_choice",
            // Mapped: its `user_id` is OpenAI's `user` (the only key Anthropic defines).
            "metadata",
        ],
    }
}

/// What a request needs of a route of another wire. What such a route drops is worked out
/// only for the route that serves (`dropped_by`): a same-wire answer, the common case, never
/// scans the prompt for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrossWire {
    /// The client's wire; `None` when the request kept no JSON of its own.
    pub wire: Option<Wire>,
    /// What only a route of the client's wire can honour: (field or part, why).
    pub needs_own_wire: Vec<(&'static str, &'static str)>,
}

impl CrossWire {
    pub fn of(req: &ChatRequest) -> CrossWire {
        let Some(v) = req.verbatim.as_deref() else {
            return CrossWire::default();
        };
        let mut out = CrossWire {
            wire: Some(v.wire),
            ..CrossWire::default()
        };
        let field = |name: &str| v.field(name).map(|raw| raw.text().trim());
        let set = |name: &str| field(name).is_some_and(|t| t != "null" && t != "false");
        let mut need = |what: &'static str, why: &'static str| {
            if !out.needs_own_wire.iter().any(|(w, _)| *w == what) {
                out.needs_own_wire.push((what, why));
            }
        };
        let parts = || req.messages.iter().flat_map(|m| m.opaque_parts());
        match v.wire {
            Wire::OpenAi => {
                if set("logprobs") || set("top_logprobs") {
                    need("logprobs", "an Anthropic-wire route returns no log-probabilities");
                }
                if set("functions") || set("function_call") {
                    need(
                        "functions",
                        "the deprecated functions are not mapped to Anthropic tools",
                    );
                }
                if set("audio") || field("modalities").is_some_and(|m| m.contains("\"audio\"")) {
                    need("audio", "an Anthropic-wire route has no audio output");
                }
                for (_, kind) in parts() {
                    match kind {
                        "input_audio" => need("input_audio", "an Anthropic-wire route takes no audio"),
                        _ => need("file", "file parts are not mapped to Anthropic documents"),
                    }
                }
            }
            Wire::Anthropic => {
                if field("thinking").is_some_and(|t| !t.contains("\"disabled\"")) {
                    need("thinking", "an OpenAI-wire route returns no signed thinking blocks");
                }
                for name in ["mcp_servers", "container"] {
                    if set(name) {
                        need(name, "run by Anthropic itself");
                    }
                }
                for (_, kind) in parts() {
                    match kind {
                        "thinking" | "redacted_thinking" => need(
                            "thinking blocks",
                            "thinking blocks in the history go back to Anthropic unchanged",
                        ),
                        _ => need("document", "document and search_result blocks are not mapped"),
                    }
                }
            }
        }
        out
    }

    /// What a route of the other wire drops of the request: every field its typed view does
    /// not carry, by name, in the client's order, and `cache_control` when any is set.
    fn dropped(&self, req: &ChatRequest, v: &Verbatim) -> Vec<Box<str>> {
        let needed: Vec<&str> = self.needs_own_wire.iter().map(|(w, _)| *w).collect();
        // `reasoning_effort` is mapped to a thinking budget when Anthropic can take one; the
        // sampling thinking refuses is then dropped.
        let thinks = req
            .thinking_budget(req.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS))
            .is_some();
        let refused_by_thinking = |name: &str| match name {
            "temperature" => req.sampling.temperature.is_some_and(|t| t.clamp(0.0, 1.0) != 1.0),
            "top_p" => req.sampling.top_p.is_some_and(|p| p < 0.95),
            _ => false,
        };
        let mut dropped: Vec<Box<str>> = v
            .fields
            .iter()
            .map(|(name, _)| &**name)
            .filter(|name| {
                let mapped = carried(v.wire).contains(name) || (thinks && *name == "reasoning_effort");
                (!mapped || (thinks && refused_by_thinking(name))) && !needed.contains(name) && *name != "top_logprobs"
            })
            .map(Box::from)
            .collect();
        let cached = req
            .messages
            .iter()
            .filter_map(|m| m.json.as_ref().and_then(|j| j.in_wire(v.wire)))
            .chain(v.field("system"))
            .chain(v.field("tools"))
            .any(|raw| raw.text().contains("\"cache_control\""));
        if cached {
            dropped.push("cache_control".into());
        }
        dropped
    }

    /// Why a route of `route_wire` cannot serve the request, if it cannot.
    pub fn refusal(&self, route_wire: Wire) -> Option<String> {
        if self.wire.is_none_or(|w| w == route_wire) || self.needs_own_wire.is_empty() {
            return None;
        }
        let wire = self.wire.map(Wire::as_str).unwrap_or_default();
        let reasons: Vec<String> = self
            .needs_own_wire
            .iter()
            .map(|(what, why)| format!("{what} ({why})"))
            .collect();
        Some(format!("needs an {wire}-wire route for {}", reasons.join(", ")))
    }

    /// What a route of `route_wire` drops of the request: on another wire, every field its
    /// typed view does not carry; on the client's own, the fields its model's `rules` drop.
    pub fn dropped_by(&self, req: &ChatRequest, route_wire: Wire, rules: &ModelRules) -> Vec<Box<str>> {
        match (self.wire, req.verbatim.as_deref()) {
            (Some(w), Some(v)) if w != route_wire => self.dropped(req, v),
            (Some(_), Some(v)) => v
                .fields
                .iter()
                .filter(|(name, _)| rules.drops.contains(name))
                .map(|(name, _)| name.clone())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The first field the client sent that the route's model refuses (`ModelRules::refuses`:
    /// the answer depends on it), on the client's own wire; another wire's are `refusal`'s.
    pub fn refused_by<'r>(&self, req: &ChatRequest, route_wire: Wire, rules: &'r ModelRules) -> Option<&'r str> {
        let v = req.verbatim.as_deref().filter(|v| v.wire == route_wire)?;
        rules
            .refuses
            .iter()
            .find(|name| {
                v.field(name)
                    .is_some_and(|raw| !matches!(raw.text().trim(), "null" | "false"))
            })
            .map(|name| &**name)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::types::{RawJson, Verbatim};

    fn request(wire: Wire, body: &str) -> ChatRequest {
        let fields: Vec<(Box<str>, RawJson)> = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(body)
            .expect("JSON object")
            .into_iter()
            .map(|(k, v)| {
                let raw = serde_json::value::RawValue::from_string(v.to_string()).expect("JSON");
                (k.into_boxed_str(), RawJson::new(raw))
            })
            .collect();
        ChatRequest {
            verbatim: Some(Arc::new(Verbatim {
                wire,
                fields,
                headers: Vec::new(),
            })),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn logprobs_need_an_openai_route_and_the_rest_is_dropped_with_a_note() {
        let req = request(
            Wire::OpenAi,
            r#"{"model":"m","messages":[],"logprobs":true,"top_logprobs":3,"store":true,"seed":1,"temperature":0.2}"#,
        );
        let cross = CrossWire::of(&req);
        let refusal = cross.refusal(Wire::Anthropic).expect("not eligible");
        assert!(refusal.contains("logprobs"), "{refusal}");
        assert_eq!(cross.refusal(Wire::OpenAi), None, "its own wire takes it as sent");
        // (The test's fields come in key order: `request` builds them from a map.)
        let anthropic_rules = ModelRules::for_model(Wire::Anthropic, "claude-sonnet-4-5");
        assert_eq!(
            cross.dropped_by(&req, Wire::Anthropic, &anthropic_rules),
            [Box::from("seed"), Box::from("store")]
        );
        let plain_rules = ModelRules::for_model(Wire::OpenAi, "gpt-4o-mini");
        assert!(cross.dropped_by(&req, Wire::OpenAi, &plain_rules).is_empty());
        let reasoning = ModelRules::for_model(Wire::OpenAi, "o4-mini");
        assert_eq!(
            cross.dropped_by(&req, Wire::OpenAi, &reasoning),
            [Box::from("temperature")]
        );
        assert_eq!(cross.refused_by(&req, Wire::OpenAi, &reasoning), Some("logprobs"));
        assert_eq!(cross.refused_by(&req, Wire::OpenAi, &plain_rules), None);
        let plain_req = request(Wire::OpenAi, r#"{"model":"m","logprobs":false,"user":"u"}"#);
        let plain = CrossWire::of(&plain_req);
        assert_eq!(plain.refusal(Wire::Anthropic), None, "logprobs: false asks nothing");
        assert_eq!(plain.refused_by(&plain_req, Wire::OpenAi, &reasoning), None);
        assert_eq!(
            plain.dropped_by(&plain_req, Wire::Anthropic, &plain_rules),
            [Box::from("logprobs")],
            "user is mapped"
        );
    }

    #[test]
    fn anthropic_thinking_needs_an_anthropic_route_unless_disabled() {
        let on = request(
            Wire::Anthropic,
            r#"{"thinking":{"type":"enabled","budget_tokens":2048},"top_k":5}"#,
        );
        let cross = CrossWire::of(&on);
        assert!(cross.refusal(Wire::OpenAi).is_some_and(|r| r.contains("thinking")));
        let openai_rules = ModelRules::for_model(Wire::OpenAi, "gpt-4o-mini");
        assert_eq!(cross.dropped_by(&on, Wire::OpenAi, &openai_rules), [Box::from("top_k")]);
        let off = request(Wire::Anthropic, r#"{"thinking":{"type":"disabled"}}"#);
        assert_eq!(CrossWire::of(&off).refusal(Wire::OpenAi), None);
        assert_eq!(
            CrossWire::of(&off).dropped_by(&off, Wire::OpenAi, &openai_rules),
            [Box::from("thinking")]
        );
    }

    #[test]
    fn a_request_without_its_own_json_loses_nothing() {
        let cross = CrossWire::of(&ChatRequest::default());
        assert_eq!(cross, CrossWire::default());
        assert_eq!(cross.refusal(Wire::Anthropic), None);
    }
}
