//! The `cleave` binary's command line, run as a user runs it: the subcommands the README names
//! answer `--help`, `serve --print-config` resolves the CPU default without loading anything, and
//! bad arguments fail with a message that names them.
//!
//! (Being an integration test of this package, it also makes `cargo test --workspace` build
//! target/<profile>/cleave with the tests' features, which loadtests' e2e test then runs instead
//! of building its own.)

use std::process::{Command, Output};

fn cleave(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cleave"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running the cleave binary")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn every_subcommand_answers_help() {
    let top = cleave(&["--help"]);
    assert!(top.status.success(), "{}", text(&top));
    for sub in ["serve", "generate", "kernels-check", "gen-checkpoint"] {
        assert!(text(&top).contains(sub), "`cleave --help` does not list {sub}: {}", text(&top));
        let o = cleave(&[sub, "--help"]);
        assert!(o.status.success(), "cleave {sub} --help: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: cleave"), "cleave {sub} --help: {}", text(&o));
    }
}

#[test]
fn serve_prints_the_cpu_default_without_loading() {
    let o = cleave(&["serve", "--print-config"]);
    assert!(o.status.success(), "{}", text(&o));
    let yaml = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = yaml.lines().collect();
    assert!(lines.contains(&"model: models/tiny-r1"), "the CPU default serves models/tiny-r1: {yaml}");
    assert!(lines.contains(&"device: cpu"), "the CPU default runs on the CPU: {yaml}");
}

#[test]
fn bad_arguments_fail_naming_them() {
    let o = cleave(&["serve", "--config", "configs/no-such-file.yaml", "--print-config"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no-such-file.yaml"), "the error names the file: {}", text(&o));
    let o = cleave(&["serve", "--port", "not-a-port"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--port"), "the error names the flag: {}", text(&o));
    let o = cleave(&["launch"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("launch"), "the error names the subcommand: {}", text(&o));
}
