//! The `tailcut` command as a user meets it: logs written to a file carry no colour codes,
//! and `--help` documents every option with its default and the log variables.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn logs_to_a_pipe_have_no_ansi_colour_codes() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("NO_COLOR")
        .env_remove("TAILCUT_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tailcut");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let done = line.contains("tailcut listening");
        lines.push(line);
        if done || lines.len() > 50 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("tailcut listening")),
        "the server logged its start: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains('\u{1b}')),
        "no escape codes in piped logs: {lines:?}"
    );
}

#[test]
fn help_documents_every_option_default_and_the_log_variables() {
    let out = Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args(["serve", "--help"])
        .output()
        .expect("run tailcut");
    let help = String::from_utf8_lossy(&out.stdout);
    for option in ["--config", "--listen", "--allow-unauthenticated", "--allow-origin"] {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(option))
            .unwrap_or_default();
        assert!(line.contains("[default: "), "{option} says its default: {help}");
    }
    for var in ["TAILCUT_LOG ", "TAILCUT_LOG_FORMAT"] {
        assert!(help.contains(var), "{var} is documented: {help}");
    }
}

#[test]
fn serve_reports_every_unset_key_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("keys.toml");
    let route = |name: &str, var: &str| {
        format!("[[routes]]\nname = \"{name}\"\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"{var}\"\n")
    };
    let text = format!(
        "{}{}[models.chat]\nroutes = [\"a\", \"b\"]\n",
        route("a", "TAILCUT_TEST_CLI_UNSET_A"),
        route("b", "TAILCUT_TEST_CLI_UNSET_B")
    );
    std::fs::write(&path, text).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tailcut"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .expect("run tailcut");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve refuses to start: {err}");
    for var in ["TAILCUT_TEST_CLI_UNSET_A", "TAILCUT_TEST_CLI_UNSET_B"] {
        assert!(err.contains(var), "{var} is reported: {err}");
    }
}
