//! How many tokens a prompt takes on a route: counted with the model family's tokenizer for
//! OpenAI families (`o200k`, `cl100k` via tiktoken), estimated elsewhere.
//!
//! The estimate is one token per four bytes of text plus a 10% margin: close for English on
//! both the OpenAI and Anthropic tokenizers, generous for code, and short for CJK text (about
//! one token per three bytes), which the margin and the per-message overhead partly absorb.
//!
//! Counting is lazy and bounded. Every BPE token spans at least one byte, so a prompt whose
//! byte count (plus overhead) fits the window fits without tokenizing; and no tokenizer here
//! averages more than eight bytes a token on real text, so a prompt over eight bytes per token
//! of the window is too long without tokenizing either. Only the band between is tokenized,
//! once per tokenizer per request, in chunks of at most 1 KiB cut before whitespace (where
//! tiktoken's own pieces start) so a pathological run of letters costs linear time.
//!
//! Counting happens before planning, outside any lock: [`PromptSize::count`] measures for
//! every (tokenizer, budget) the plan will ask about and returns [`PromptTokens`], plain
//! figures the planner reads without tokenizing.

use std::borrow::Cow;
use std::cell::OnceCell;

use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

use crate::config::{Config, RouteConfig, TokenizerChoice};
use crate::types::{ChatRequest, ContentPart};

/// Chat formatting per message (role markers, separators), on top of its text.
const PER_MESSAGE_TOKENS: u64 = 4;
/// Priming of the assistant's reply.
const PER_REQUEST_TOKENS: u64 = 3;
/// Framing of each tool definition around its JSON.
const PER_TOOL_TOKENS: u64 = 10;
/// One image: a high-detail 1024 px image is ~765 tokens on OpenAI and up to ~1,600 on Claude.
pub const IMAGE_TOKENS: u64 = 1_000;
/// Margin on the four-bytes-a-token estimate.
const ESTIMATE_MARGIN: f64 = 0.10;
const MAX_BYTES_PER_TOKEN: u64 = 8;
const CHUNK_BYTES: usize = 1024;
/// A run without whitespace is cut this short, bounding BPE's quadratic merge per piece.
const RUN_CHUNK_BYTES: usize = 128;

/// How a route's prompt tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    O200k,
    Cl100k,
    Estimate,
}

impl Counter {
    /// The route's configured tokenizer; `auto` asks tiktoken's model table about the model id.
    pub fn for_route(route: &RouteConfig) -> Counter {
        match route.tokenizer {
            TokenizerChoice::O200k => Counter::O200k,
            TokenizerChoice::Cl100k => Counter::Cl100k,
            TokenizerChoice::Estimate => Counter::Estimate,
            TokenizerChoice::Auto => match get_tokenizer(&route.model) {
                Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => Counter::O200k,
                Some(Tokenizer::Cl100kBase) => Counter::Cl100k,
                _ => Counter::Estimate,
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Counter::O200k => "o200k",
            Counter::Cl100k => "cl100k",
            Counter::Estimate => "estimate",
        }
    }

    /// The tokens of `text` alone (no message framing): counted with the tokenizer, else the
    /// estimate. What a continuation counts of the answer the client already holds.
    pub fn text_tokens(self, text: &str) -> u64 {
        match self.bpe() {
            Some(bpe) => count_chunked(bpe, text),
            None => estimate(text.len() as u64),
        }
    }

    fn bpe(self) -> Option<&'static CoreBPE> {
        match self {
            Counter::O200k => Some(tiktoken_rs::o200k_base_singleton()),
            Counter::Cl100k => Some(tiktoken_rs::cl100k_base_singleton()),
            Counter::Estimate => None,
        }
    }
}

/// Loads the tokenizers the configured routes use, so the first long prompt does not pay
/// for it (call once at startup; takes a fraction of a second per tokenizer).
pub fn warm_tokenizers(config: &Config) {
    let mut used: Vec<Counter> = config.routes.iter().map(Counter::for_route).collect();
    used.dedup();
    for c in [Counter::O200k, Counter::Cl100k] {
        if used.contains(&c) {
            let _ = c.bpe().map(|b| b.count_ordinary("warm"));
        }
    }
}

/// How a token figure was arrived at, for the exclusion reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// One token per byte: fits even so, nothing counted.
    UpperBound,
    /// Eight bytes per token: too long even so, nothing counted.
    LowerBound,
    Counted(Counter),
    Estimated,
}

impl Method {
    pub fn describe(self) -> &'static str {
        match self {
            Method::UpperBound => "at most, one per byte",
            Method::LowerBound => "at least, eight bytes a token",
            Method::Counted(Counter::O200k) => "counted, o200k",
            Method::Counted(Counter::Cl100k) => "counted, cl100k",
            Method::Counted(Counter::Estimate) | Method::Estimated => "estimated, four bytes a token + 10%",
        }
    }
}

/// One request's prompt, measured lazily and shared by every route of a plan.
pub struct PromptSize<'a> {
    pieces: Vec<Cow<'a, str>>,
    bytes: u64,
    overhead: u64,
    o200k: OnceCell<u64>,
    cl100k: OnceCell<u64>,
}

/// A prompt's size as planning reads it: its bytes, its fixed overhead and the exact count for
/// each tokenizer a route needed one for. Measured by [`PromptSize::count`]; `Copy`, so the
/// planner holds figures, not text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptTokens {
    bytes: u64,
    overhead: u64,
    o200k: Option<u64>,
    cl100k: Option<u64>,
}

impl<'a> PromptSize<'a> {
    pub fn new(req: &'a ChatRequest) -> Self {
        let mut pieces: Vec<Cow<'a, str>> = Vec::new();
        let mut images = 0u64;
        for m in &req.messages {
            for part in &m.content {
                match part {
                    ContentPart::Text(t) => pieces.push(Cow::Borrowed(t)),
                    // A document or audio part is counted as an image is: its own JSON (a
                    // base64 file) says nothing of its tokens.
                    ContentPart::ImageUrl { .. } | ContentPart::Opaque { .. } => images += 1,
                }
            }
            for call in &m.tool_calls {
                pieces.push(Cow::Borrowed(&call.name));
                pieces.push(Cow::Borrowed(&call.arguments));
            }
        }
        for tool in &req.tools {
            pieces.push(Cow::Borrowed(&tool.name));
            if let Some(d) = &tool.description {
                pieces.push(Cow::Borrowed(d));
            }
            pieces.push(Cow::Owned(tool.parameters.to_string()));
        }
        let bytes = pieces.iter().map(|p| p.len() as u64).sum();
        let overhead = PER_REQUEST_TOKENS
            + PER_MESSAGE_TOKENS * req.messages.len() as u64
            + PER_TOOL_TOKENS * req.tools.len() as u64
            + IMAGE_TOKENS * images;
        PromptSize {
            pieces,
            bytes,
            overhead,
            o200k: OnceCell::new(),
            cl100k: OnceCell::new(),
        }
    }

    /// Bytes of text in the prompt.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The prompt's tokens with `counter`, measured only as precisely as deciding against
    /// `budget` (window minus reserved output) needs.
    pub fn measure(&self, counter: Counter, budget: u64) -> (u64, Method) {
        measure(self.bytes, self.overhead, counter, budget, || {
            let bpe = counter.bpe()?;
            let cell = match counter {
                Counter::O200k => &self.o200k,
                _ => &self.cl100k,
            };
            Some(*cell.get_or_init(|| self.pieces.iter().map(|p| count_chunked(bpe, p)).sum()))
        })
    }

    /// The prompt's tokens with `counter`, counted whatever the budget (the estimate for
    /// `Counter::Estimate`): for billing an attempt cut before its route said.
    pub fn tokens(&self, counter: Counter) -> u64 {
        // At the lower bound as the budget, only a count can decide.
        let lower = self.bytes / MAX_BYTES_PER_TOKEN + self.overhead;
        self.measure(counter, lower).0
    }

    /// Measures against every `(counter, budget)` a plan will ask about (tokenizing only where
    /// a budget falls between the bounds) and keeps the figures.
    pub fn count(&self, asks: impl IntoIterator<Item = (Counter, u64)>) -> PromptTokens {
        for (counter, budget) in asks {
            self.measure(counter, budget);
        }
        PromptTokens {
            bytes: self.bytes,
            overhead: self.overhead,
            o200k: self.o200k.get().copied(),
            cl100k: self.cl100k.get().copied(),
        }
    }
}

impl PromptTokens {
    /// As [`PromptSize::measure`], from the figures alone. A budget nobody asked
    /// [`PromptSize::count`] about that needs an exact count gets the estimate, and says so.
    pub fn measure(&self, counter: Counter, budget: u64) -> (u64, Method) {
        let counted = match counter {
            Counter::O200k => self.o200k,
            Counter::Cl100k => self.cl100k,
            Counter::Estimate => None,
        };
        measure(self.bytes, self.overhead, counter, budget, || counted)
    }
}

/// The bounds first, then `count` (the text's tokens with the counter's tokenizer) only when
/// the budget falls between them; the estimate for `Counter::Estimate` or without a count.
fn measure(
    bytes: u64,
    overhead: u64,
    counter: Counter,
    budget: u64,
    count: impl FnOnce() -> Option<u64>,
) -> (u64, Method) {
    let estimate = || (estimate(bytes) + overhead, Method::Estimated);
    if counter == Counter::Estimate {
        return estimate();
    }
    let upper = bytes + overhead;
    if upper <= budget {
        return (upper, Method::UpperBound);
    }
    let lower = bytes / MAX_BYTES_PER_TOKEN + overhead;
    if lower > budget {
        return (lower, Method::LowerBound);
    }
    match count() {
        Some(text_tokens) => (text_tokens + overhead, Method::Counted(counter)),
        None => estimate(),
    }
}

/// Four bytes a token plus the margin.
fn estimate(bytes: u64) -> u64 {
    (bytes.div_ceil(4) as f64 * (1.0 + ESTIMATE_MARGIN)).ceil() as u64
}

/// Counts `text` in chunks cut before whitespace (or short, inside a long run).
fn count_chunked(bpe: &CoreBPE, text: &str) -> u64 {
    let mut rest = text;
    let mut total = 0u64;
    while !rest.is_empty() {
        let cut = chunk_end(rest);
        let (chunk, tail) = rest.split_at(cut);
        total += bpe.count_ordinary(chunk) as u64;
        rest = tail;
    }
    total
}

/// Where the next chunk of `s` ends: before the last whitespace within `CHUNK_BYTES`, else at
/// `RUN_CHUNK_BYTES`; always on a char boundary and never at 0.
fn chunk_end(s: &str) -> usize {
    if s.len() <= CHUNK_BYTES {
        return s.len();
    }
    let window = floor_boundary(s, CHUNK_BYTES);
    if let Some(pos) = s[..window].rfind(char::is_whitespace).filter(|&p| p > 0) {
        return pos;
    }
    let cut = floor_boundary(s, RUN_CHUNK_BYTES);
    if cut > 0 {
        cut
    } else {
        s.char_indices().nth(1).map_or(s.len(), |(i, _)| i)
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Message, Role};

    fn request(text: &str) -> ChatRequest {
        ChatRequest {
            messages: vec![Message::text(Role::User, text)],
            ..ChatRequest::default()
        }
    }

    #[test]
    fn auto_picks_the_openai_family_tokenizer_by_model_name() {
        let route = |model: &str| {
            let mut cfg = crate::config::load_str(crate::config::DEFAULT_TOML).expect("default config");
            let mut r = cfg.routes.remove(0);
            r.model = model.to_string();
            Counter::for_route(&r)
        };
        assert_eq!(route("gpt-4o-mini"), Counter::O200k, "gpt-4o is an o200k model");
        assert_eq!(route("gpt-4-turbo"), Counter::Cl100k, "gpt-4 is a cl100k model");
        assert_eq!(
            route("claude-sonnet-4"),
            Counter::Estimate,
            "no tiktoken family: estimate"
        );
    }

    #[test]
    fn short_prompt_fits_on_its_byte_count_without_tokenizing() {
        let req = request("hello there");
        let size = PromptSize::new(&req);
        let (tokens, how) = size.measure(Counter::O200k, 1_000);
        assert_eq!(
            how,
            Method::UpperBound,
            "a prompt shorter than the window in bytes fits"
        );
        assert!(tokens <= 1_000);
        assert!(size.o200k.get().is_none(), "nothing was tokenized");
    }

    #[test]
    fn prompt_near_the_window_is_counted_exactly() {
        let text = "the quick brown fox jumps over the lazy dog ".repeat(200);
        let req = request(&text);
        let size = PromptSize::new(&req);
        let (tokens, how) = size.measure(Counter::Cl100k, 3_000);
        assert_eq!(
            how,
            Method::Counted(Counter::Cl100k),
            "8.8 KB against 3k tokens must be counted"
        );
        let exact = tiktoken_rs::cl100k_base_singleton().count_ordinary(&text) as u64;
        let overhead = PER_REQUEST_TOKENS + PER_MESSAGE_TOKENS;
        assert!(
            tokens.abs_diff(exact + overhead) <= 2,
            "chunked count {tokens} vs whole {exact} + {overhead}"
        );
    }

    #[test]
    fn a_long_run_without_whitespace_is_chunked_on_char_boundaries() {
        let text = "é".repeat(5_000);
        let mut rest = text.as_str();
        while rest.len() > CHUNK_BYTES {
            let cut = chunk_end(rest);
            assert!(
                cut > 0 && cut <= RUN_CHUNK_BYTES,
                "a run is cut short: chunk of {cut} bytes"
            );
            assert!(rest.is_char_boundary(cut), "cut at {cut} splits a character");
            rest = &rest[cut..];
        }
        assert_eq!(
            chunk_end(rest),
            rest.len(),
            "the tail up to {CHUNK_BYTES} bytes is one chunk"
        );
    }

    #[test]
    fn text_tokens_count_the_text_alone() {
        assert_eq!(Counter::O200k.text_tokens("One two three four"), 4, "a word a token");
        assert_eq!(Counter::Cl100k.text_tokens(""), 0);
        assert_eq!(
            Counter::Estimate.text_tokens("One two three four"),
            6,
            "18 bytes: 5 tokens, plus 10%"
        );
    }

    #[test]
    fn estimate_is_four_bytes_a_token_plus_margin() {
        let req = request(&"x".repeat(4_000));
        let (tokens, how) = PromptSize::new(&req).measure(Counter::Estimate, 10);
        assert_eq!(how, Method::Estimated);
        assert_eq!(
            tokens,
            1_100 + PER_REQUEST_TOKENS + PER_MESSAGE_TOKENS,
            "1,000 tokens + 10% + overhead"
        );
    }

    #[test]
    fn counted_figures_answer_as_the_lazy_measure_did_without_tokenizing_again() {
        let text = "the quick brown fox jumps over the lazy dog ".repeat(200);
        let req = request(&text);
        let size = PromptSize::new(&req);
        let asks = [
            (Counter::Cl100k, 3_000),
            (Counter::O200k, 100_000),
            (Counter::Estimate, 10),
        ];
        let tokens = size.count(asks);
        for (counter, budget) in asks {
            assert_eq!(
                tokens.measure(counter, budget),
                size.measure(counter, budget),
                "{counter:?} against {budget}"
            );
        }
        assert!(size.o200k.get().is_none(), "o200k fit on bytes: never tokenized");
        let (_, how) = tokens.measure(Counter::O200k, 3_000);
        assert_eq!(
            how,
            Method::Estimated,
            "a count nobody asked for is estimated, and says so"
        );
    }
}
