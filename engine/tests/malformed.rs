//! A broken checkpoint or config gives an error that names the file and the problem.

use std::path::{Path, PathBuf};

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::{Engine, EngineConfig};

fn golden(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/golden").join(case)
}

/// A scratch copy of a golden case that a test may damage.
fn scratch(case: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cleave-malformed-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(golden(case)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn load_err(dir: &Path) -> String {
    let cfg = EngineConfig { num_blocks: 64, max_model_len: Some(512), ..EngineConfig::default() };
    match Engine::load(CpuBackend, dir, cfg) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites a safetensors file with one tensor renamed, reshaped or retyped.
fn edit_safetensors(path: &Path, edit: impl Fn(&str, &mut serde_json::Value)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let names: Vec<String> = header.keys().cloned().collect();
    let mut renamed = serde_json::Map::new();
    for k in names {
        let mut v = header.remove(&k).unwrap();
        edit(&k, &mut v);
        let key = v.get("__rename").and_then(|r| r.as_str()).map(str::to_string).unwrap_or(k);
        if let Some(o) = v.as_object_mut() {
            o.remove("__rename");
        }
        renamed.insert(key, v);
    }
    let mut h = serde_json::to_vec(&renamed).unwrap();
    while (h.len() + 8) % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

const KV_B: &str = "model.layers.1.self_attn.kv_b_proj.weight";

#[test]
fn missing_tensor_is_named() {
    let dir = scratch("bf16-qlora", "missing");
    edit_safetensors(&dir.join("model.safetensors"), |k, v| {
        if k == KV_B {
            v["__rename"] = "something.else".into();
        }
    });
    let e = load_err(&dir);
    assert!(e.contains(KV_B) && e.contains("missing"), "{e}");
}

#[test]
fn wrong_shape_names_file_tensor_and_shapes() {
    let dir = scratch("bf16-qlora", "shape");
    edit_safetensors(&dir.join("model.safetensors"), |k, v| {
        if k == KV_B {
            let s = v["shape"].as_array().unwrap().clone();
            v["shape"] = serde_json::json!([s[1], s[0]]);
        }
    });
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains(KV_B) && e.contains("expected [128, 32]"), "{e}");
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = scratch("bf16-qlora", "dtype");
    edit_safetensors(&dir.join("model.safetensors"), |k, v| {
        if k == KV_B {
            v["dtype"] = "I16".into();
        }
    });
    let e = load_err(&dir);
    assert!(e.contains(KV_B) && e.contains("unsupported dtype"), "{e}");
}

#[test]
fn bad_config_and_missing_files_are_explained() {
    let dir = scratch("bf16-qlora", "config");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), cfg.replace("\"n_group\": 4", "\"n_group\": 3")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains("`n_group`"), "{e}");

    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    assert!(load_err(&dir).contains("not valid JSON"));

    std::fs::write(dir.join("config.json"), cfg).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"short").unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{e}");

    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert!(load_err(&dir).contains("no model.safetensors"));
    assert!(load_err(Path::new("/nonexistent/model")).contains("/nonexistent/model/config.json"));
}

#[test]
fn a_shard_named_in_the_index_but_absent_is_named() {
    let dir = scratch("f32-noqlora", "shard");
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    assert!(load_err(&dir).contains("model-00002-of-00002.safetensors"));
}

#[test]
fn unusable_engine_settings_are_config_errors_naming_the_setting() {
    let cfg = EngineConfig { max_num_seqs: 0, ..EngineConfig::default() };
    match Engine::load(CpuBackend, &golden("bf16-qlora"), cfg) {
        Err(cleave_engine::EngineError::Config(m)) => assert!(m.contains("max_num_seqs"), "{m}"),
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("max_num_seqs 0 was accepted"),
    }
}
