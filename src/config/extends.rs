//! `extends = "default"`: a file that changes only a few keys of the embedded default. The
//! file's tables are merged into the default's key by key, recursively; any other value
//! (a number, a string, an array, so also `[[routes]]` as a whole) replaces the default's.

use super::DEFAULT_TOML;

/// The one base a file may extend.
pub const BASE: &str = "default";

/// The table `extends` asks for: the file's own without the key, the default merged with
/// the file's with it, or the problem with its value.
pub(super) fn resolve(mut table: toml::Table) -> Result<toml::Table, String> {
    let Some(base) = table.remove("extends") else {
        return Ok(table);
    };
    match base.as_str() {
        Some(BASE) => {}
        Some(other) => {
            return Err(format!(
                "{other:?}: only \"{BASE}\" (the embedded config) can be extended"
            ))
        }
        None => return Err(format!("must be the string \"{BASE}\"")),
    }
    let mut merged: toml::Table =
        toml::from_str(DEFAULT_TOML).map_err(|e| format!("the embedded default does not parse: {e}"))?;
    merge(&mut merged, table);
    Ok(merged)
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(base)), toml::Value::Table(over)) => merge(base, over),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_merge_and_other_values_replace() {
        let file: toml::Table =
            toml::from_str("extends = \"default\"\n[server]\nlisten = \"127.0.0.1:9999\"\n[hedge]\nenabled = false\n")
                .expect("toml");
        let merged = resolve(file).expect("extends default");
        assert_eq!(
            merged["server"]["listen"].as_str(),
            Some("127.0.0.1:9999"),
            "overridden"
        );
        assert_eq!(
            merged["server"]["max_streams"].as_integer(),
            Some(5000),
            "kept from the default"
        );
        assert_eq!(merged["hedge"]["enabled"].as_bool(), Some(false), "overridden");
        assert!(merged.contains_key("routes"), "the default's routes stay");
        assert!(!merged.contains_key("extends"), "the key itself is consumed");
    }

    #[test]
    fn only_the_default_can_be_extended() {
        let file: toml::Table = toml::from_str("extends = \"prod\"").expect("toml");
        assert!(resolve(file).is_err_and(|e| e.contains("only \"default\"")), "refused");
    }
}
