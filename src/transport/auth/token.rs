//! Browser tokens: short-lived, HMAC-SHA256-signed claims (the key they were minted with, its
//! tenant, the models allowed, the expiry), and the clock they expire by.
//!
//! Wire form: `tct_` + base64url(JSON claims) + `.` + base64url(HMAC-SHA256 over everything
//! before the dot). Stateless: any tailcut with the same secret verifies it; a token cannot
//! be revoked before it expires except by changing the secret or removing its key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::time::Instant;

/// What every token starts with (API keys from `tailcut keys new` start with `tc_`).
pub const TOKEN_PREFIX: &str = "tct_";
/// The longest-lived token `POST /v1/tokens` mints.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// A token's life when the request names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// A shorter secret is refused (tokens stay off): HMAC-SHA256 wants 32 bytes of key.
pub const MIN_SECRET_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// What a token says. Short field names: the token rides in URLs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// The name of the key it was minted with (its limits apply).
    #[serde(rename = "k")]
    pub key: String,
    #[serde(rename = "t")]
    pub tenant: String,
    /// The models it may use; `None`: whatever its key may use.
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Expiry, Unix seconds.
    #[serde(rename = "e")]
    pub exp: u64,
    /// Which key of that name: `key_fingerprint` of its hash. A key replaced under the same
    /// name (rotated) no longer matches, so the old key's tokens go with it. A token without
    /// it is refused.
    #[serde(rename = "h")]
    pub key_fp: String,
}

/// A key's fingerprint for its tokens: 8 bytes of SHA-256 over a label and the key's stored
/// hash, hex. It names one key without saying anything of its hash (tokens are readable).
pub fn key_fingerprint(key_sha256: &[u8; 32]) -> String {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"tailcut token key\0");
    h.update(key_sha256);
    hex::encode(&h.finalize()[..8])
}

/// Why a token was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token this server signed (or damaged).
    Invalid,
    Expired,
}

/// Signs and verifies tokens with the secret from `auth.token_secret_env`.
pub struct Signer {
    mac: HmacSha256,
}

impl Signer {
    /// `None` for a secret shorter than `MIN_SECRET_BYTES`.
    pub fn new(secret: &[u8]) -> Option<Self> {
        if secret.len() < MIN_SECRET_BYTES {
            return None;
        }
        HmacSha256::new_from_slice(secret).ok().map(|mac| Signer { mac })
    }

    pub fn sign(&self, claims: &Claims) -> String {
        let payload = serde_json::to_vec(claims).unwrap_or_default();
        let mut token = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(payload));
        let mut mac = self.mac.clone();
        mac.update(token.as_bytes());
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()));
        token
    }

    /// The claims of a token this signer made that has not expired at `now_unix`.
    pub fn verify(&self, token: &str, now_unix: u64) -> Result<Claims, TokenError> {
        let (signed, signature) = token.rsplit_once('.').ok_or(TokenError::Invalid)?;
        let payload = signed.strip_prefix(TOKEN_PREFIX).ok_or(TokenError::Invalid)?;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| TokenError::Invalid)?;
        let mut mac = self.mac.clone();
        mac.update(signed.as_bytes());
        // Constant-time comparison of the signature.
        mac.verify_slice(&signature).map_err(|_| TokenError::Invalid)?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| TokenError::Invalid)?;
        let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Invalid)?;
        if now_unix >= claims.exp {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

/// Unix time that moves with `tokio::time::Instant`: read once from the wall clock at startup,
/// then advanced by the monotonic clock, so expiry follows paused time in tests and never
/// jumps with a wall-clock step. (Servers sharing a secret agree to within their drift since
/// start.)
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    unix_at_start: Duration,
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            unix_at_start: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default(),
            start: Instant::now(),
        }
    }

    pub fn now_unix(&self) -> u64 {
        (self.unix_at_start + self.start.elapsed()).as_secs()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new(&[7u8; 32]).expect("a 32-byte secret")
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            key: "app".into(),
            tenant: "acme".into(),
            models: Some(vec!["chat".into()]),
            exp,
            key_fp: key_fingerprint(&[1u8; 32]),
        }
    }

    #[test]
    fn a_signed_token_verifies_until_it_expires() {
        let token = signer().sign(&claims(1_000));
        assert!(token.starts_with(TOKEN_PREFIX), "prefixed: {token}");
        assert!(
            token.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "URL-safe as it is: {token}"
        );
        assert_eq!(signer().verify(&token, 999), Ok(claims(1_000)), "valid before exp");
        assert_eq!(
            signer().verify(&token, 1_000),
            Err(TokenError::Expired),
            "expired at exp"
        );
    }

    #[test]
    fn a_changed_or_foreign_token_is_invalid() {
        let token = signer().sign(&claims(1_000));
        let other = Signer::new(&[8u8; 32]).expect("secret");
        assert_eq!(other.verify(&token, 0), Err(TokenError::Invalid), "another secret");
        let (payload, sig) = token.rsplit_once('.').expect("dot");
        let forged = signer().sign(&Claims {
            tenant: "other".into(),
            ..claims(1_000)
        });
        let (forged_payload, _) = forged.rsplit_once('.').expect("dot");
        assert_eq!(
            signer().verify(&format!("{forged_payload}.{sig}"), 0),
            Err(TokenError::Invalid),
            "claims swapped under a signature"
        );
        for bad in ["", "tct_", "tct_.", "tc_abc.def", &format!("{payload}."), payload] {
            assert_eq!(signer().verify(bad, 0), Err(TokenError::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(Signer::new(b"short").is_none(), "under 32 bytes");
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_follows_paused_time() {
        let clock = Clock::new();
        let before = clock.now_unix();
        tokio::time::advance(Duration::from_secs(601)).await;
        assert!(clock.now_unix() >= before + 601, "advanced with tokio's clock");
    }
}
