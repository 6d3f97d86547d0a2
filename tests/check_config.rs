//! `tailcut check-config`, run as a user runs it: every problem at once, each on one line
//! under its full key path; every unset `*_env` variable (an error, a warning with
//! `--offline`); host names in listen addresses; and a file that extends the embedded default.

use std::path::Path;
use std::process::Output;

fn check(file: &Path, extra: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .arg("check-config")
        .arg(file)
        .args(extra)
        .output()
        .expect("run tailcut")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write the config");
    path
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const ROUTES: &str = r#"
[[routes]]
name = "a"
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"
api_key_env = "TAILCUT_TEST_CHECK_UNSET_A"
[[routes]]
name = "b"
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"
api_key_env = "TAILCUT_TEST_CHECK_UNSET_B"
[models.chat]
routes = ["a", "b"]
"#;

#[test]
fn every_problem_is_one_line_under_its_full_key_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = "[server]\nmax_body_bytes = \"big\"\ncolour = \"blue\"\n[hedge]\nfloor_ms = -1\n".to_string() + ROUTES;
    let out = check(&write(&dir, "types.toml", &text), &["--offline"]);
    assert!(!out.status.success(), "type errors fail the check");
    let err = stderr(&out);
    let line = |path: &str| {
        err.lines()
            .find(|l| l.contains(&format!("error: {path}: ")))
            .map(str::to_string)
    };
    assert!(
        line("server.max_body_bytes").is_some_and(|l| l.contains("invalid type")),
        "the type error is under server.max_body_bytes, on its line: {err}"
    );
    assert!(line("server.colour").is_some(), "the unknown key too: {err}");
    assert!(line("hedge.floor_ms").is_some(), "and the other section's error: {err}");
    assert!(
        err.lines()
            .all(|l| l.contains(": error: ") || l.contains(": warning: ") || l.contains("error(s)")),
        "no continuation lines: {err}"
    );
}

#[test]
fn unset_env_variables_are_errors_and_warnings_offline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(
        &dir,
        "env.toml",
        &format!("[server]\nlisten = \"127.0.0.1:0\"\n{ROUTES}"),
    );
    let out = check(&file, &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "unset keys fail the check: {err}");
    for (path, var) in [
        ("routes[0].api_key_env", "TAILCUT_TEST_CHECK_UNSET_A"),
        ("routes[1].api_key_env", "TAILCUT_TEST_CHECK_UNSET_B"),
    ] {
        assert!(
            err.contains(&format!("error: {path}: environment variable {var} is not set")),
            "{path} is reported: {err}"
        );
    }
    let out = check(&file, &["--offline"]);
    let err = stderr(&out);
    assert!(out.status.success(), "offline, they are warnings: {err}");
    assert_eq!(err.matches("warning: routes[").count(), 2, "both warned about: {err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok"),
        "and the file is ok"
    );
}

#[test]
fn a_host_name_listen_address_is_resolved() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = "[server]\nlisten = \"localhost:8083\"\n".to_string() + ROUTES;
    let out = check(&write(&dir, "host.toml", &text), &["--offline"]);
    assert!(
        out.status.success(),
        "localhost:8083 is a listen address: {}",
        stderr(&out)
    );
    let bad = "[server]\nlisten = \"localhost\"\n".to_string() + ROUTES;
    let out = check(&write(&dir, "noport.toml", &bad), &["--offline"]);
    assert!(
        stderr(&out).contains("error: server.listen: "),
        "a name without a port is still refused: {}",
        stderr(&out)
    );
}

#[test]
fn a_file_that_extends_the_default_changes_only_its_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = "extends = \"default\"\n[server]\nlisten = \"127.0.0.1:9090\"\n[hedge]\nenabled = false\n";
    let out = check(&write(&dir, "over.toml", text), &[]);
    assert!(out.status.success(), "the override checks clean: {}", stderr(&out));
    let config = tailcut::config::load_str(text).expect("loads");
    let default = tailcut::config::load_str(tailcut::config::DEFAULT_TOML).expect("default");
    assert_eq!(config.server.listen.port(), 9090, "the key it sets");
    assert!(!config.hedge.enabled, "and the other one");
    assert_eq!(config.routes.len(), default.routes.len(), "the default's routes stay");
    assert_eq!(
        config.server.max_streams, default.server.max_streams,
        "and its other keys"
    );

    let out = check(&write(&dir, "other.toml", "extends = \"prod\"\n"), &[]);
    assert!(
        stderr(&out).contains("error: extends: "),
        "only the default can be extended: {}",
        stderr(&out)
    );
}

#[test]
fn unset_env_variables_are_reported_beside_the_files_other_problems() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = format!("[server]\nlisten = \"127.0.0.1:0\"\nmax_stream = 1\n{ROUTES}");
    let out = check(&write(&dir, "both.toml", &text), &[]);
    assert!(!out.status.success(), "an unknown key fails the check");
    let err = stderr(&out);
    assert!(err.contains("error: server.max_stream: unknown key"), "{err}");
    for (i, var) in [(0, "TAILCUT_TEST_CHECK_UNSET_A"), (1, "TAILCUT_TEST_CHECK_UNSET_B")] {
        assert!(
            err.contains(&format!(
                "error: routes[{i}].api_key_env: environment variable {var} is not set"
            )),
            "the unset variable is still found: {err}"
        );
    }
    assert!(err.contains("3 error(s)"), "{err}");
}
