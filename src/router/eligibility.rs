//! Eligibility before preference: may this route serve this request at all? Every "no"
//! carries a reason that ends up in the decision record and in the error when nothing fits.

use crate::config::RouteConfig;
use crate::gateway::RequestCtx;
use crate::types::{ChatRequest, ResponseFormat};

/// Prompt tokens estimated from characters: about 4 characters per token for English text
/// across the OpenAI and Anthropic tokenizers, rounded up, plus a per-message overhead.
/// An estimate, documented as such; the margin below absorbs its error.
pub fn estimate_prompt_tokens(req: &ChatRequest) -> u32 {
    let chars = req.text_len() + req.tools.iter().map(|t| t.parameters.to_string().len() + t.name.len()).sum::<usize>();
    let tokens = chars.div_ceil(4) + req.messages.len() * 4;
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// Safety margin on the context window for the estimate's error.
const CONTEXT_MARGIN: f64 = 0.1;

/// `Ok` when `route` may serve `req`, else why not.
pub fn check(route: &RouteConfig, req: &ChatRequest, ctx: &RequestCtx) -> Result<(), String> {
    if let Some(region) = &ctx.region {
        if !route.region.eq_ignore_ascii_case(region) {
            return Err(format!("region {} is not the required {region}", route.region));
        }
    }
    if !req.tools.is_empty() && !route.capabilities.tools {
        return Err("route does not support tools".into());
    }
    if req.messages.iter().any(|m| m.has_images()) && !route.capabilities.vision {
        return Err("route does not support images".into());
    }
    if matches!(req.response_format, Some(ResponseFormat::JsonSchema { .. })) && !route.capabilities.json_schema {
        return Err("route has no native json_schema output".into());
    }
    let prompt = estimate_prompt_tokens(req);
    let output = req.max_tokens.unwrap_or(0).min(route.max_output);
    let needed = (f64::from(prompt) * (1.0 + CONTEXT_MARGIN)) as u64 + u64::from(output);
    if needed > u64::from(route.context_window) {
        return Err(format!(
            "needs ~{needed} tokens (prompt ~{prompt} + output {output} + margin), window is {}",
            route.context_window
        ));
    }
    Ok(())
}
