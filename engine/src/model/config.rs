//! `config.json` of a DeepSeek-V3/R1-architecture checkpoint, read field by field so that a bad
//! value is reported with its name.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// YaRN parameters (`rope_scaling` or, in newer transformers, `rope_parameters`).
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// 0 when absent (transformers treats a missing value as falsy).
    pub mscale: f64,
    pub mscale_all_dim: f64,
    /// Explicit cos/sin factor, overriding the mscale rule.
    pub attention_factor: Option<f64>,
    /// Floor/ceil the correction range (default true).
    pub truncate: bool,
}

/// Weight quantization declared by `quantization_config`.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantization {
    /// FP8 e4m3 weights with f32 `weight_scale_inv` per `[b0, b1]` block.
    Fp8 { block: [usize; 2] },
    /// AutoAWQ "gemm" int4 (`qweight` / `qzeros` / `scales` per linear layer).
    Awq(AwqConfig),
}

/// AutoAWQ "gemm" int4 quantization: asymmetric 4-bit weights with a zero point and an f16 scale
/// per `group_size` input channels.
#[derive(Debug, Clone, PartialEq)]
pub struct AwqConfig {
    pub group_size: usize,
    /// Module name fragments left unquantized (HF's rule: a module is skipped when its name
    /// contains one of them).
    pub modules_to_not_convert: Vec<String>,
}

impl AwqConfig {
    /// Whether the linear layer named `prefix` is kept unquantized.
    pub fn skips(&self, prefix: &str) -> bool {
        self.modules_to_not_convert.iter().any(|m| !m.is_empty() && prefix.contains(m.as_str()))
    }
}

/// The model hyper-parameters cleave needs, validated.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub num_attention_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub rope_theta: f64,
    pub rope_interleave: bool,
    pub yarn: Option<Yarn>,
    pub max_position_embeddings: usize,
    pub quantization: Option<Quantization>,
}

impl ModelConfig {
    /// Reads and validates `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| EngineError::io(&path, e))?;
        Self::from_json_str(&text, &path)
    }

    /// Parses a config.json body; `path` is used in error messages only.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| EngineError::checkpoint(path, format!("not valid JSON: {e}")))?;
        let obj = value.as_object().ok_or_else(|| EngineError::checkpoint(path, "top level is not a JSON object"))?;
        let f = Fields { obj, path, prefix: String::new() };
        let n_routed_experts = f.usize_or("n_routed_experts", 0)?;
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| f.bad("eos_token_id", "a token id or a list of token ids"))?,
            Some(v) => {
                vec![v.as_u64().ok_or_else(|| f.bad("eos_token_id", "a token id or a list of token ids"))? as u32]
            }
        };
        let cfg = ModelConfig {
            hidden_size: f.usize("hidden_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            first_k_dense_replace: f.usize_or("first_k_dense_replace", 0)?,
            moe_layer_freq: f.usize_or("moe_layer_freq", 1)?,
            intermediate_size: f.usize("intermediate_size")?,
            moe_intermediate_size: f.usize_or("moe_intermediate_size", 0)?,
            n_routed_experts,
            n_shared_experts: f.usize_or("n_shared_experts", 0)?,
            num_experts_per_tok: f.usize_or("num_experts_per_tok", 0)?,
            n_group: f.usize_or("n_group", 1)?,
            topk_group: f.usize_or("topk_group", 1)?,
            routed_scaling_factor: f.f64_or("routed_scaling_factor", 1.0)? as f32,
            norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
            num_attention_heads: f.usize("num_attention_heads")?,
            q_lora_rank: f.opt_usize("q_lora_rank")?,
            kv_lora_rank: f.usize("kv_lora_rank")?,
            qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
            qk_rope_head_dim: f.usize("qk_rope_head_dim")?,
            v_head_dim: f.usize("v_head_dim")?,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)? as f32,
            vocab_size: f.usize("vocab_size")?,
            bos_token_id: f.opt_usize("bos_token_id")?.map(|x| x as u32),
            eos_token_ids,
            rope_theta: rope_theta(&f)?,
            rope_interleave: f.bool_or("rope_interleave", true)?,
            yarn: yarn(&f)?,
            max_position_embeddings: f.usize_or("max_position_embeddings", 4096)?,
            quantization: quantization(&f)?,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |field: &str, msg: String| Err(EngineError::checkpoint(path, format!("`{field}`: {msg}")));
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 {
                return bad(name, "must be positive".into());
            }
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return bad("qk_rope_head_dim", format!("must be even, got {}", self.qk_rope_head_dim));
        }
        if self.has_moe() {
            if self.n_group == 0 || !self.n_routed_experts.is_multiple_of(self.n_group) {
                return bad(
                    "n_group",
                    format!("must divide n_routed_experts ({}), got {}", self.n_routed_experts, self.n_group),
                );
            }
            if self.topk_group == 0 || self.topk_group > self.n_group {
                return bad("topk_group", format!("must be in 1..={}, got {}", self.n_group, self.topk_group));
            }
            let per_group = self.n_routed_experts / self.n_group;
            if per_group < 2 {
                return bad("n_group", "each group needs at least 2 experts (group score is a top-2 sum)".into());
            }
            if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.topk_group * per_group {
                return bad(
                    "num_experts_per_tok",
                    format!("must be in 1..={}, got {}", self.topk_group * per_group, self.num_experts_per_tok),
                );
            }
            if self.moe_intermediate_size == 0 {
                return bad("moe_intermediate_size", "must be positive for MoE layers".into());
            }
            if self.moe_layer_freq == 0 {
                return bad("moe_layer_freq", "must be positive".into());
            }
        }
        Ok(())
    }

    fn has_moe(&self) -> bool {
        self.n_routed_experts > 0 && self.num_hidden_layers > self.first_k_dense_replace
    }

    /// Whether decoder layer `layer` uses the MoE block (otherwise a dense MLP).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.n_routed_experts > 0 && layer >= self.first_k_dense_replace && layer.is_multiple_of(self.moe_layer_freq)
    }

    /// Query/key head width: nope + rope.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Values cached per token per layer: the latent plus the shared rope key.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Softmax scale, including YaRN's mscale correction (REFERENCE.md section 5).
    pub fn softmax_scale(&self) -> f32 {
        let mut scale = (self.qk_head_dim() as f64).powf(-0.5);
        if let Some(y) = &self.yarn {
            if y.mscale_all_dim != 0.0 {
                let m = yarn_mscale(y.factor, y.mscale_all_dim);
                scale *= m * m;
            }
        }
        scale as f32
    }

    /// The FP8 block size when the checkpoint is FP8 block-quantized.
    pub fn fp8_block(&self) -> Option<[usize; 2]> {
        match &self.quantization {
            Some(Quantization::Fp8 { block }) => Some(*block),
            _ => None,
        }
    }

    /// The AWQ settings when the checkpoint is AWQ-quantized.
    pub fn awq(&self) -> Option<&AwqConfig> {
        match &self.quantization {
            Some(Quantization::Awq(a)) => Some(a),
            _ => None,
        }
    }

    /// The context length the model serves.
    pub fn max_model_len(&self) -> usize {
        self.max_position_embeddings
    }
}

/// YaRN's magnitude correction `0.1 * m * ln(s) + 1` (1 when s <= 1).
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
    /// `parent.` for a nested object, so messages name the full field.
    prefix: String,
}

impl Fields<'_> {
    fn bad(&self, field: &str, expected: &str) -> EngineError {
        let got = self.obj.get(field).map(|v| v.to_string()).unwrap_or_else(|| "nothing".into());
        EngineError::checkpoint(
            PathBuf::from(self.path),
            format!("`{}{field}` must be {expected}, got {got}", self.prefix),
        )
    }
    fn usize(&self, field: &str) -> Result<usize> {
        match self.obj.get(field) {
            None => Err(EngineError::checkpoint(self.path, format!("missing field `{}{field}`", self.prefix))),
            Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| self.bad(field, "a non-negative integer")),
        }
    }
    fn usize_or(&self, field: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(field)?.unwrap_or(default))
    }
    fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| self.bad(field, "a non-negative integer or null"))
            }
        }
    }
    fn f64_or(&self, field: &str, default: f64) -> Result<f64> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.bad(field, "a number")),
        }
    }
    fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(field, "true or false")),
        }
    }
    fn sub(&self, field: &str) -> Result<Option<Fields<'_>>> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(o)) => {
                Ok(Some(Fields { obj: o, path: self.path, prefix: format!("{}{field}.", self.prefix) }))
            }
            Some(_) => Err(self.bad(field, "an object")),
        }
    }
}

fn rope_params<'a>(f: &'a Fields<'a>) -> Result<Option<(&'static str, Fields<'a>)>> {
    if let Some(p) = f.sub("rope_parameters")? {
        return Ok(Some(("rope_parameters", p)));
    }
    Ok(f.sub("rope_scaling")?.map(|s| ("rope_scaling", s)))
}

fn rope_theta(f: &Fields) -> Result<f64> {
    if let Some((_, p)) = rope_params(f)? {
        if p.obj.contains_key("rope_theta") {
            return p.f64_or("rope_theta", 10000.0);
        }
    }
    f.f64_or("rope_theta", 10000.0)
}

fn yarn(f: &Fields) -> Result<Option<Yarn>> {
    let Some((name, p)) = rope_params(f)? else { return Ok(None) };
    let kind = p.obj.get("rope_type").or_else(|| p.obj.get("type")).and_then(Value::as_str).unwrap_or("default");
    match kind {
        "default" => Ok(None),
        "yarn" => {
            let orig = match p.opt_usize("original_max_position_embeddings")? {
                Some(v) => v,
                None => f.usize("max_position_embeddings")?,
            };
            let max_pos = f.usize_or("max_position_embeddings", orig)? as f64;
            let nonzero = |v: f64, d: f64| if v == 0.0 { d } else { v };
            Ok(Some(Yarn {
                factor: p.f64_or("factor", max_pos / orig as f64)?,
                original_max_position_embeddings: orig,
                beta_fast: nonzero(p.f64_or("beta_fast", 32.0)?, 32.0),
                beta_slow: nonzero(p.f64_or("beta_slow", 1.0)?, 1.0),
                mscale: p.f64_or("mscale", 0.0)?,
                mscale_all_dim: p.f64_or("mscale_all_dim", 0.0)?,
                attention_factor: match p.obj.get("attention_factor") {
                    None | Some(Value::Null) => None,
                    Some(_) => Some(p.f64_or("attention_factor", 1.0)?),
                },
                truncate: p.bool_or("truncate", true)?,
            }))
        }
        other => Err(EngineError::checkpoint(
            f.path,
            format!("`{name}.rope_type` {other:?} is not supported (default or yarn)"),
        )),
    }
}

fn quantization(f: &Fields) -> Result<Option<Quantization>> {
    let Some(q) = f.sub("quantization_config")? else { return Ok(None) };
    let field = |name: &str| format!("`quantization_config.{name}`");
    let method = q.obj.get("quant_method").and_then(Value::as_str).unwrap_or("");
    match method {
        "fp8" => {
            if let Some(fmt) = q.obj.get("fmt").and_then(Value::as_str) {
                if fmt != "e4m3" {
                    return Err(EngineError::checkpoint(
                        f.path,
                        format!("{} {fmt:?} is not supported (e4m3)", field("fmt")),
                    ));
                }
            }
            let block = match q.obj.get("weight_block_size") {
                None | Some(Value::Null) => [128, 128],
                Some(Value::Array(a)) if a.len() == 2 && a.iter().all(|v| v.as_u64().is_some_and(|x| x > 0)) => {
                    [a[0].as_u64().unwrap() as usize, a[1].as_u64().unwrap() as usize]
                }
                Some(_) => return Err(q.bad("weight_block_size", "two positive integers")),
            };
            Ok(Some(Quantization::Fp8 { block }))
        }
        "awq" => {
            // AutoAWQ writes bits/group_size/version/zero_point; its older quant_config.json
            // spelling (w_bit, q_group_size) is accepted too.
            let bits = match q.opt_usize("bits")? {
                Some(b) => b,
                None => q.usize_or("w_bit", 4)?,
            };
            if bits != 4 {
                return Err(EngineError::checkpoint(
                    f.path,
                    format!("{} {bits} is not supported (4-bit AWQ only)", field("bits")),
                ));
            }
            let group_size = match q.obj.get("group_size").or_else(|| q.obj.get("q_group_size")) {
                Some(v) => match v.as_i64() {
                    Some(g) if g > 0 => g as usize,
                    _ => return Err(q.bad("group_size", "a positive integer (per-channel -1 is not supported)")),
                },
                None => return Err(EngineError::checkpoint(f.path, format!("missing field {}", field("group_size")))),
            };
            let version = q.obj.get("version").and_then(Value::as_str).unwrap_or("gemm");
            if !version.eq_ignore_ascii_case("gemm") {
                return Err(EngineError::checkpoint(
                    f.path,
                    format!("{} {version:?} is not supported (AutoAWQ \"gemm\" packing only)", field("version")),
                ));
            }
            if !q.bool_or("zero_point", true)? {
                return Err(EngineError::checkpoint(
                    f.path,
                    format!("{} false is not supported (asymmetric AWQ with zero points only)", field("zero_point")),
                ));
            }
            let modules_to_not_convert = match q.obj.get("modules_to_not_convert") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| q.bad("modules_to_not_convert", "a list of module names"))?,
                Some(_) => return Err(q.bad("modules_to_not_convert", "a list of module names")),
            };
            Ok(Some(Quantization::Awq(AwqConfig { group_size, modules_to_not_convert })))
        }
        other => Err(EngineError::checkpoint(
            f.path,
            format!("{} {other:?} is not supported (fp8 or awq)", field("quant_method")),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3_json() -> String {
        r#"{"hidden_size":7168,"num_hidden_layers":61,"first_k_dense_replace":3,"intermediate_size":18432,
        "moe_intermediate_size":2048,"n_routed_experts":256,"n_shared_experts":1,"num_experts_per_tok":8,
        "n_group":8,"topk_group":4,"routed_scaling_factor":2.5,"norm_topk_prob":true,"num_attention_heads":128,
        "q_lora_rank":1536,"kv_lora_rank":512,"qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128,
        "rms_norm_eps":1e-6,"vocab_size":129280,"bos_token_id":0,"eos_token_id":1,"rope_theta":10000,
        "rope_scaling":{"type":"yarn","factor":40,"original_max_position_embeddings":4096,"beta_fast":32,
        "beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0},"max_position_embeddings":163840,
        "quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}}"#
            .to_string()
    }

    #[test]
    fn v3_softmax_scale_matches_reference() {
        let c = ModelConfig::from_json_str(&v3_json(), Path::new("config.json")).unwrap();
        assert!((c.softmax_scale() - 0.13523).abs() < 1e-4, "{}", c.softmax_scale());
        assert_eq!(c.latent_dim(), 576);
        assert!(c.is_moe_layer(3) && !c.is_moe_layer(2));
        assert_eq!(c.quantization, Some(Quantization::Fp8 { block: [128, 128] }));
    }

    #[test]
    fn rope_parameters_replace_rope_scaling() {
        let text = v3_json()
            .replace("\"rope_scaling\"", "\"rope_parameters\"")
            .replace("\"type\":\"yarn\"", "\"rope_type\":\"yarn\",\"rope_theta\":5000");
        let c = ModelConfig::from_json_str(&text, Path::new("config.json")).unwrap();
        assert_eq!(c.rope_theta, 5000.0);
        assert_eq!(c.yarn.unwrap().factor, 40.0);
    }

    #[test]
    fn errors_name_the_field() {
        let text = v3_json().replace("\"kv_lora_rank\":512", "\"kv_lora_rank\":\"big\"");
        let e = ModelConfig::from_json_str(&text, Path::new("m/config.json")).unwrap_err().to_string();
        assert!(e.contains("m/config.json") && e.contains("`kv_lora_rank`"), "{e}");
        let text = v3_json().replace("\"n_group\":8", "\"n_group\":7");
        let e = ModelConfig::from_json_str(&text, Path::new("config.json")).unwrap_err().to_string();
        assert!(e.contains("`n_group`"), "{e}");
        let text = v3_json().replace("\"hidden_size\":7168,", "");
        let e = ModelConfig::from_json_str(&text, Path::new("config.json")).unwrap_err().to_string();
        assert!(e.contains("missing field `hidden_size`"), "{e}");
    }
}
