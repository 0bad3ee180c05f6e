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
    while !(h.len() + 8).is_multiple_of(8) {
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

/// Rewrites `quantization_config` of a scratch copy's config.json.
fn edit_quant_config(dir: &Path, edit: impl Fn(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(cfg["quantization_config"].as_object_mut().unwrap());
    std::fs::write(&path, cfg.to_string()).unwrap();
}

const AWQ_UP: &str = "model.layers.1.mlp.experts.3.up_proj";

#[test]
fn awq_settings_cleave_cannot_serve_name_the_field() {
    type Edit = fn(&mut serde_json::Map<String, serde_json::Value>);
    let cases: [(&str, Edit, &str); 5] = [
        ("bits", |q| drop(q.insert("bits".into(), 8.into())), "`quantization_config.bits` 8"),
        ("gemv", |q| drop(q.insert("version".into(), "gemv".into())), "`quantization_config.version` \"gemv\""),
        ("marlin", |q| drop(q.insert("version".into(), "marlin".into())), "\"marlin\" is not supported"),
        ("zp", |q| drop(q.insert("zero_point".into(), false.into())), "`quantization_config.zero_point`"),
        ("group", |q| drop(q.insert("group_size".into(), (-1).into())), "`quantization_config.group_size`"),
    ];
    for (name, edit, want) in cases {
        let dir = scratch("awq-g128", &format!("awq-{name}"));
        edit_quant_config(&dir, edit);
        let e = load_err(&dir);
        assert!(e.contains("config.json") && e.contains(want), "{name}: {e}");
    }
}

#[test]
fn a_group_size_that_does_not_divide_the_inputs_is_named() {
    let dir = scratch("awq-g128", "awq-group96");
    edit_quant_config(&dir, |q| drop(q.insert("group_size".into(), 96.into())));
    let e = load_err(&dir);
    assert!(e.contains(".qweight`") && e.contains("group_size` 96 does not divide"), "{e}");
}

#[test]
fn awq_tensors_with_wrong_shapes_or_dtypes_are_named() {
    let dir = scratch("awq-g128", "awq-zeros");
    edit_safetensors(&dir.join("model.safetensors"), |k, v| {
        if k == format!("{AWQ_UP}.qzeros") {
            let s = v["shape"].as_array().unwrap().clone();
            v["shape"] = serde_json::json!([s[1], s[0]]);
        }
    });
    let e = load_err(&dir);
    assert!(e.contains(&format!("{AWQ_UP}.qzeros")) && e.contains("shape"), "{e}");

    let dir = scratch("awq-g128", "awq-dtype");
    edit_safetensors(&dir.join("model.safetensors"), |k, v| {
        if k == format!("{AWQ_UP}.scales") {
            v["dtype"] = "I16".into();
        }
    });
    let e = load_err(&dir);
    assert!(e.contains(&format!("{AWQ_UP}.scales")) && e.contains("I16"), "{e}");
}

#[test]
fn awq_tensors_the_config_does_not_declare_are_refused() {
    let dir = scratch("awq-g128", "awq-undeclared");
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(e.contains(".qweight`") && e.contains("quant_method awq"), "{e}");

    let dir = scratch("awq-g128", "awq-skipped");
    edit_quant_config(&dir, |q| drop(q.insert("modules_to_not_convert".into(), serde_json::json!(["mlp.experts"]))));
    let e = load_err(&dir);
    assert!(e.contains("modules_to_not_convert") && e.contains("mlp.experts"), "{e}");
}
