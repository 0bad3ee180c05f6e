//! The shipped deployment files parse and validate; file errors name the file, field and line;
//! a relative model path resolves against the current directory, then the config's parent dir.

mod common;

use cleave_actors::config::{DeployConfig, Device, FailurePolicy};
use cleave_actors::{ActorError, Cluster};
use common::*;

fn shipped() -> Vec<(String, DeployConfig)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo().join("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let cfg = DeployConfig::from_yaml_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.file_name().unwrap().to_string_lossy().into_owned(), cfg));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn every_shipped_config_is_valid_and_has_its_shape() {
    let all = shipped();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "cpu-2p2d.yaml",
            "cpu-colocated.yaml",
            "cpu-groups.yaml",
            "cpu-tiny.yaml",
            "h200-1gpu.yaml",
            "h200-1p1d.yaml",
            "h200-4p4d.yaml"
        ]
    );
    let get = |n: &str| all.iter().find(|(name, _)| name == n).unwrap().1.clone();
    for (name, cfg) in &all {
        assert_eq!(cfg.model, std::path::Path::new("models/tiny-r1"), "{name}");
        assert_eq!(cfg.kv_transfer.failure_policy, FailurePolicy::Recompute, "{name}");
        let mut with_golden = cfg.clone();
        with_golden.model = golden();
        with_golden.resolve_model(None).unwrap();
        with_golden.check().unwrap();
    }
    let tiny = get("cpu-tiny.yaml");
    assert_eq!((tiny.device, tiny.prefill.ranks.clone(), tiny.decode.ranks.clone()), (Device::Cpu, vec![0], vec![1]));
    let p2d2 = get("cpu-2p2d.yaml");
    assert_eq!((p2d2.prefill.ranks.len(), p2d2.decode.ranks.len(), p2d2.router.prefill_threshold), (2, 2, 256));
    assert!(!get("cpu-colocated.yaml").is_disaggregated());
    let groups = get("cpu-groups.yaml");
    assert_eq!((groups.prefill.parallel().tensor_parallel_size, groups.prefill.parallel().world()), (2, 2));
    let d = groups.decode.parallel();
    assert_eq!((d.data_parallel_size, d.enable_expert_parallel, d.world()), (2, true, 2));
    assert!(!get("h200-1gpu.yaml").is_disaggregated());
    let p1d1 = get("h200-1p1d.yaml");
    assert_eq!((p1d1.device, p1d1.prefill.ranks.clone(), p1d1.decode.ranks.clone()), (Device::Cuda, vec![0], vec![1]));
    let p4d4 = get("h200-4p4d.yaml");
    assert_eq!((p4d4.prefill.ranks.clone(), p4d4.decode.ranks.clone()), (vec![0, 1, 2, 3], vec![4, 5, 6, 7]));
    assert_eq!(p4d4.kv_cache.gpu_memory_utilization, Some(0.9));
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cleave-actors-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("configs")).unwrap();
    d
}

#[test]
fn file_errors_name_the_file_field_and_line() {
    let root = scratch("errors");
    let file = root.join("configs/bad.yaml");
    std::fs::write(&file, "model: m\ndecode:\n  ranks: [1]\n  max_num_seqs: 0\n").unwrap();
    let e = DeployConfig::from_yaml_file(&file).unwrap_err();
    assert_eq!((e.field.as_deref(), e.line), (Some("decode.max_num_seqs"), Some(4)));
    assert!(e.to_string().starts_with(&format!("{}:4: decode.max_num_seqs:", file.display())), "{e}");
    std::fs::write(&file, "model: m\nrouter: {prefill_treshold: 3}\n").unwrap();
    let e = DeployConfig::from_yaml_file(&file).unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("unknown field `prefill_treshold`"), "{e}");
    std::fs::write(&file, "model: models/none\n").unwrap();
    let e = DeployConfig::from_yaml_file(&file).unwrap_err();
    assert_eq!((e.field.as_deref(), e.line), (Some("model"), Some(1)), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_relative_model_resolves_against_the_config_files_parent_directory() {
    let root = scratch("resolve");
    std::os::unix::fs::symlink(golden(), root.join("golden-model")).unwrap();
    let file = root.join("configs/ok.yaml");
    std::fs::write(&file, "model: golden-model\ndecode: {ranks: [0]}\nkv_cache: {num_blocks: 64}\n").unwrap();
    let cfg = DeployConfig::from_yaml_file(&file).unwrap();
    assert_eq!(cfg.model, root.join("golden-model"));
    assert_eq!(cfg.served_model_name(), "golden-model");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_start_error() {
    if let Ok(n) = cleave_kernels::probe() {
        eprintln!("skipped: {n} GPU(s) here; this test is about machines without one");
        return;
    }
    let t = std::time::Instant::now();
    let e = Cluster::start(config("h200-1p1d.yaml", |cfg| cfg.kv_cache.num_blocks = None)).err();
    assert!(matches!(&e, Some(ActorError::Config(c)) if c.field.as_deref() == Some("device")), "{e:?}");
    let msg = e.unwrap().to_string();
    assert!(msg.contains("cuda ranks need an NVIDIA GPU") && msg.contains("none is usable here"), "{msg}");
    assert!(t.elapsed() < std::time::Duration::from_secs(5), "the refusal must not wait on ranks");
}

/// `chat_template` (vLLM's `--chat-template`) replaces the checkpoint's: a file, or the template
/// itself; a path that is neither is a start error naming the field. The R1 tool template in
/// configs/ is the embedded default's own.
#[test]
fn chat_template_replaces_the_models_and_a_bad_one_names_the_field() {
    use cleave_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
    let file = repo().join("configs/tool_chat_template_deepseekr1.jinja");
    let tiny = Tokenizer::from_dir(&repo().join("models/tiny-r1")).unwrap();
    let mut from_file = Tokenizer::from_dir(&repo().join("models/tiny-r1")).unwrap();
    from_file.set_chat_template(std::fs::read_to_string(&file).unwrap(), "file").unwrap();
    let tools =
        [serde_json::json!({"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}})];
    let msgs = [ChatMessage::new("system", "S"), ChatMessage::new("user", "What is 1 + 2?")];
    let with_tools = ChatOptions { tools: Some(&tools), ..ChatOptions::generation() };
    assert_eq!(
        from_file.apply_chat_template(&msgs, with_tools).unwrap(),
        tiny.apply_chat_template(&msgs, with_tools).unwrap()
    );
    let hi = [ChatMessage::new("user", "hi")];
    let opts = ChatOptions::generation();
    for (template, expect) in [
        (file.display().to_string(), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n"),
        ("{{ messages[0]['content'] }}!".to_string(), "hi!"),
    ] {
        let c = Cluster::start(config("cpu-colocated.yaml", |cfg| cfg.chat_template = Some(template.clone()))).unwrap();
        assert_eq!(c.tokenizer().apply_chat_template(&hi, opts).unwrap(), expect);
        c.shutdown();
    }
    for bad in ["no/such/template.jinja", "{{ unclosed"] {
        let e = Cluster::start(config("cpu-colocated.yaml", |cfg| cfg.chat_template = Some(bad.into()))).err();
        assert!(matches!(&e, Some(ActorError::Config(c)) if c.field.as_deref() == Some("chat_template")), "{e:?}");
    }
}
