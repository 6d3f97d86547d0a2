//! `tailcut keys new`: a fresh random client key and the `[[auth.keys]]` lines that hold
//! only its hash.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::TryRngCore;

use super::credential::sha256;
use crate::config::valid_key_name;

/// What every generated key starts with (tokens start with `tct_`).
pub const KEY_PREFIX: &str = "tc_";
/// Random bytes in a key: 256 bits.
const KEY_BYTES: usize = 32;

/// A new key: the key itself (shown once, never stored) and the config lines for it.
pub struct NewKey {
    pub key: String,
    pub sha256_hex: String,
    /// A `[[auth.keys]]` entry, ready to append to a config file.
    pub toml: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error("the operating system's random number generator failed: {0}")]
    Rng(String),
    #[error("{0:?} is not a key name (1 to 64 letters, digits, '-', '_' or '.')")]
    BadName(String),
    #[error("the tenant name must not be empty")]
    NoTenant,
}

/// A key for `tenant`, from the OS random number generator, named `name` or
/// `<tenant>-<first 8 hex of its hash>`.
pub fn new_key(tenant: &str, name: Option<&str>) -> Result<NewKey, KeygenError> {
    if tenant.trim().is_empty() {
        return Err(KeygenError::NoTenant);
    }
    let mut bytes = [0u8; KEY_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| KeygenError::Rng(e.to_string()))?;
    let key = format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes));
    let sha256_hex = hex::encode(sha256(&key));
    let name = match name {
        Some(n) if valid_key_name(n) => n.to_string(),
        Some(n) => return Err(KeygenError::BadName(n.to_string())),
        None => default_name(tenant, &sha256_hex),
    };
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let toml = format!(
        "[[auth.keys]]\nname = {}\nsha256 = \"{sha256_hex}\"\ntenant = {}\n\
         # optional: models = [\"chat\"], rpm = 600, tpm = 200000, max_streams = 100, priority = \"interactive\"\n",
        quote(&name),
        quote(tenant),
    );
    Ok(NewKey { key, sha256_hex, toml })
}

/// `<tenant>-<8 hex>`, with characters a key name cannot hold replaced by `-`.
fn default_name(tenant: &str, hash_hex: &str) -> String {
    let mut base: String = tenant
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    base.push('-');
    base.push_str(&hash_hex[..8]);
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_random_prefixed_and_hashed() {
        let a = new_key("eu-private", None).expect("key");
        let b = new_key("eu-private", None).expect("key");
        assert_ne!(a.key, b.key, "random");
        assert!(a.key.starts_with(KEY_PREFIX), "prefixed: {}", a.key);
        assert_eq!(a.key.len(), KEY_PREFIX.len() + 43, "32 bytes in unpadded base64url");
        assert_eq!(a.sha256_hex, hex::encode(sha256(&a.key)), "hash of the key");
        assert!(!a.toml.contains(&a.key), "the config lines never hold the key");
        assert!(
            a.toml
                .contains(&format!("name = \"eu-private-{}\"", &a.sha256_hex[..8])),
            "{}",
            a.toml
        );
    }

    #[test]
    fn names_are_checked_or_derived_safely() {
        assert!(
            matches!(new_key("t", Some("bad name")), Err(KeygenError::BadName(_))),
            "space"
        );
        assert!(matches!(new_key(" ", None), Err(KeygenError::NoTenant)), "no tenant");
        let k = new_key("acme corp\"", Some("frontend")).expect("key");
        assert!(k.toml.contains("name = \"frontend\""), "{}", k.toml);
        let parsed: toml::Table = toml::from_str(&k.toml).expect("the lines are TOML");
        assert_eq!(
            parsed["auth"]["keys"][0]["tenant"].as_str(),
            Some("acme corp\""),
            "the tenant is quoted, whatever it holds"
        );
        let derived = new_key("acme corp", None).expect("key");
        assert!(derived.toml.contains("name = \"acme-corp-"), "{}", derived.toml);
    }
}
