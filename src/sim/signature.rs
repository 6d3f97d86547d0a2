//! Thinking signatures: what the simulator signs a `thinking` block's text with and seals a
//! `redacted_thinking` block's `data` in, and how it checks the ones a request carries back.
//!
//! The real API's signatures are opaque and bound to the block's exact text; any edit, a
//! block from elsewhere or an empty signature is refused. The simulator's are HMAC-SHA256
//! under a key of its own, base64-encoded: deterministic (the same text always gets the same
//! signature, on every simulator, so a conversation replays across restarts) and verifiable
//! by the simulator alone, so a gateway that edits, trims, re-serializes or invents a block
//! is caught as the real API catches it. A `redacted_thinking` block's `data` is sealed the
//! same way: only data the simulator issued passes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// The simulator's signing key. Not a secret: the point is only that a signature comes from
/// the simulator and covers exactly the text it was issued for.
const KEY: &[u8] = b"tailcut-sim/thinking-signature/v1";

/// Bytes of opaque payload inside a redacted block's data, before its tag.
const REDACTED_PAYLOAD: usize = 48;

fn mac(domain: &[u8], bytes: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(KEY).expect("HMAC takes a key of any length");
    mac.update(domain);
    mac.update(&[0]);
    mac.update(bytes);
    mac
}

/// The signature the simulator gives a thinking block whose text is `thinking`.
pub(crate) fn sign(thinking: &str) -> String {
    STANDARD.encode(mac(b"thinking", thinking.as_bytes()).finalize().into_bytes())
}

/// Whether `signature` is the one the simulator issued for exactly this text.
pub(crate) fn verifies(thinking: &str, signature: &str) -> bool {
    let Ok(tag) = STANDARD.decode(signature) else {
        return false;
    };
    mac(b"thinking", thinking.as_bytes()).verify_slice(&tag).is_ok()
}

/// Opaque `data` for a redacted thinking block, derived from `seed` (the prompt).
pub(crate) fn redacted_data(seed: &str) -> String {
    let mut payload = Vec::with_capacity(REDACTED_PAYLOAD + 32);
    let mut block = Sha256::digest(seed.as_bytes());
    while payload.len() < REDACTED_PAYLOAD {
        payload.extend_from_slice(&block);
        block = Sha256::digest(block);
    }
    payload.truncate(REDACTED_PAYLOAD);
    let tag = mac(b"redacted", &payload).finalize().into_bytes();
    payload.extend_from_slice(&tag);
    STANDARD.encode(payload)
}

/// Whether `data` is redacted thinking the simulator issued, unchanged.
pub(crate) fn seals(data: &str) -> bool {
    let Ok(bytes) = STANDARD.decode(data) else {
        return false;
    };
    let Some((payload, tag)) = bytes.split_at_checked(REDACTED_PAYLOAD) else {
        return false;
    };
    mac(b"redacted", payload).verify_slice(tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_its_own_text() {
        let signature = sign("Let me think.");
        assert_eq!(signature, sign("Let me think."), "deterministic");
        assert!(verifies("Let me think.", &signature), "its own text");
        assert!(!verifies("Let me think!", &signature), "an edited text");
        assert!(!verifies("Let me think.", "c2lnbmF0dXJl"), "a foreign signature");
        assert!(!verifies("Let me think.", "not base64 at all"), "not base64");
        assert!(verifies("", &sign("")), "omitted thinking signs the empty text");
    }

    #[test]
    fn redacted_data_is_sealed_and_any_change_breaks_the_seal() {
        let data = redacted_data("prompt");
        assert!(seals(&data), "issued data: {data}");
        assert_eq!(data, redacted_data("prompt"), "deterministic");
        assert_ne!(data, redacted_data("other"), "derived from the seed");
        let mut bytes = STANDARD.decode(&data).unwrap_or_default();
        bytes[0] ^= 1;
        assert!(!seals(&STANDARD.encode(&bytes)), "a flipped bit");
        assert!(!seals("EmwKAhgBEgy3va3pzix"), "made up");
        assert!(!seals(""), "empty");
    }
}
