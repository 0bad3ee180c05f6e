//! Semantic checks of a parsed [`DeployConfig`], and finding a field's line in the YAML text.

use std::collections::HashSet;

use super::{DeployConfig, Device, Dtype};

type Invalid = (String, String);

/// The shortest heartbeat timeout: five idle beats.
const MIN_HEARTBEAT_MS: u64 = 500;

fn positive(field: &str, v: usize) -> Result<(), Invalid> {
    if v == 0 {
        return Err((field.into(), "must be at least 1".into()));
    }
    Ok(())
}

/// A pool's parallel sizes, and its ranks forming whole groups.
fn groups(pool: &str, ranks: &[usize], tp: usize, dp: usize) -> Result<(), Invalid> {
    positive(&format!("{pool}.tensor_parallel_size"), tp)?;
    positive(&format!("{pool}.data_parallel_size"), dp)?;
    if !ranks.len().is_multiple_of(tp * dp) {
        return Err((
            format!("{pool}.ranks"),
            format!(
                "{} ranks do not form whole groups of tensor_parallel_size x data_parallel_size = {} ranks",
                ranks.len(),
                tp * dp
            ),
        ));
    }
    Ok(())
}

fn distinct(field: &str, ranks: &[usize]) -> Result<(), Invalid> {
    let mut seen = HashSet::new();
    for (i, r) in ranks.iter().enumerate() {
        if !seen.insert(r) {
            return Err((format!("{field}[{i}]"), format!("rank {r} is listed twice")));
        }
    }
    Ok(())
}

impl DeployConfig {
    /// Checks values that parse but make no sense; returns the field path and the problem.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if self.model.as_os_str().is_empty() {
            return Err(("model".into(), "must name a model directory".into()));
        }
        if let Some(name) = &self.served_model_name {
            if name.trim().is_empty() {
                return Err(("served_model_name".into(), "must not be empty".into()));
            }
        }
        if let Some(n) = self.max_model_len {
            positive("max_model_len", n)?;
        }
        if self.device == Device::Cpu && self.dtype == Dtype::Bfloat16 {
            return Err(("dtype".into(), "bfloat16 needs device: cuda (the CPU backend computes in float32)".into()));
        }
        if self.server.host.trim().is_empty() {
            return Err(("server.host".into(), "must not be empty".into()));
        }
        positive("server.max_concurrent_requests", self.server.max_concurrent_requests)?;
        positive("server.max_connections", self.server.max_connections)?;
        positive("server.header_timeout_ms", self.server.header_timeout_ms as usize)?;
        positive("server.body_timeout_ms", self.server.body_timeout_ms as usize)?;

        let p = &self.prefill;
        groups("prefill", &p.ranks, p.tensor_parallel_size, p.data_parallel_size)?;
        positive("prefill.max_num_batched_tokens", self.prefill.max_num_batched_tokens)?;
        positive("prefill.max_num_seqs", self.prefill.max_num_seqs)?;
        distinct("prefill.ranks", &self.prefill.ranks)?;

        if self.decode.ranks.is_empty() {
            return Err(("decode.ranks".into(), "needs at least one rank".into()));
        }
        let d = &self.decode;
        groups("decode", &d.ranks, d.tensor_parallel_size, d.data_parallel_size)?;
        positive("decode.max_num_seqs", self.decode.max_num_seqs)?;
        positive("decode.max_num_batched_tokens", self.decode.max_num_batched_tokens)?;
        distinct("decode.ranks", &self.decode.ranks)?;
        if let Some((i, r)) = self.decode.ranks.iter().enumerate().find(|(_, r)| self.prefill.ranks.contains(r)) {
            return Err((
                format!("decode.ranks[{i}]"),
                format!("rank {r} is also a prefill rank; the pools must not overlap"),
            ));
        }

        positive("router.prefill_threshold", self.router.prefill_threshold)?;
        positive("router.max_prefill_queue", self.router.max_prefill_queue)?;

        let kv = &self.kv_cache;
        positive("kv_cache.block_size", kv.block_size)?;
        match (kv.gpu_memory_utilization, kv.num_blocks) {
            (Some(_), Some(_)) => {
                return Err((
                    "kv_cache.num_blocks".into(),
                    "set either gpu_memory_utilization or num_blocks, not both".into(),
                ))
            }
            (Some(u), None) => {
                if !(u > 0.0 && u <= 1.0) {
                    return Err(("kv_cache.gpu_memory_utilization".into(), format!("must be in (0, 1], got {u}")));
                }
                if self.device == Device::Cpu {
                    return Err((
                        "kv_cache.gpu_memory_utilization".into(),
                        "applies to device: cuda; set kv_cache.num_blocks for device: cpu".into(),
                    ));
                }
            }
            (None, Some(n)) => positive("kv_cache.num_blocks", n)?,
            (None, None) => {}
        }
        if let (Some(n), Some(len)) = (kv.num_blocks, self.max_model_len) {
            if n * kv.block_size < len {
                return Err((
                    "kv_cache.num_blocks".into(),
                    format!("{n} blocks of {} tokens cannot hold one sequence of max_model_len {len}", kv.block_size),
                ));
            }
        }

        if self.kv_transfer.timeout_ms == 0 {
            return Err(("kv_transfer.timeout_ms".into(), "must be at least 1".into()));
        }
        if self.supervisor.heartbeat_timeout_ms < MIN_HEARTBEAT_MS {
            return Err((
                "supervisor.heartbeat_timeout_ms".into(),
                format!(
                    "must be at least {MIN_HEARTBEAT_MS} (an idle rank beats every 100 ms), got {}",
                    self.supervisor.heartbeat_timeout_ms
                ),
            ));
        }
        if self.supervisor.max_step_ms < MIN_HEARTBEAT_MS {
            return Err((
                "supervisor.max_step_ms".into(),
                format!("must be at least {MIN_HEARTBEAT_MS}, got {}", self.supervisor.max_step_ms),
            ));
        }
        Ok(())
    }
}

/// Best-effort line (1-based) of a field path such as `decode.ranks[1]` in YAML text: each
/// segment's key is searched after the previous one, in block or flow style.
pub(super) fn locate(text: &str, path: &str) -> Option<usize> {
    let mut from = 0;
    for seg in path.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        from = find_key(text, key, from)?;
    }
    Some(text[..from].matches('\n').count() + 1)
}

fn find_key(text: &str, key: &str, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(off) = text[at..].find(key) {
        let start = at + off;
        let end = start + key.len();
        let before_ok = text[..start].chars().next_back().is_none_or(|c| c.is_whitespace() || c == '{' || c == ',');
        let after_ok = text[end..].trim_start_matches([' ', '\t']).starts_with(':');
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let commented = text[line_start..start].contains('#');
        if before_ok && after_ok && !commented {
            return Some(start);
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigError, DeployConfig};
    use cleave_engine::weights::LoadFormat;

    fn err(yaml: &str) -> ConfigError {
        DeployConfig::from_yaml_str(yaml).expect_err("should be rejected")
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let c = DeployConfig::from_yaml_str("model: models/tiny-r1\n").unwrap();
        assert_eq!(c.decode.ranks, vec![0]);
        assert!(c.prefill.ranks.is_empty());
        assert_eq!(c.served_model_name(), "tiny-r1");
        assert_eq!(c.kv_transfer.timeout_ms, 30_000);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_field_and_line() {
        let e = err("model: m\ndecode:\n  ranks: [1]\n  max_num_seq: 3\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("decode"), Some(4)), "{e}");
        assert!(e.message.contains("unknown field `max_num_seq`"), "{e}");
        let e = err("model: m\ndecode: {ranks: [1, a]}\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("decode.ranks[1]"), Some(2)), "{e}");
        let e = err("model: m\nkv_transfer: {failure_policy: retry}\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(err("decode: {ranks: [0]}\n").message.contains("missing field `model`"));
    }

    #[test]
    fn semantic_errors_name_field_and_line() {
        let e = err("model: m\nprefill:\n  ranks: [0, 1]\ndecode:\n  ranks: [2, 1]\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("decode.ranks[1]"), Some(5)), "{e}");
        assert!(e.to_string().contains("line 5: decode.ranks[1]: rank 1 is also a prefill rank"), "{e}");
        let e = err("model: m\ndecode: {ranks: [0], max_num_seqs: 0}\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("decode.max_num_seqs"), Some(2)));
        let e = err("model: m\nprefill: {ranks: [1, 2, 3], tensor_parallel_size: 2}\n");
        assert_eq!(e.field.as_deref(), Some("prefill.ranks"));
        assert!(e.message.contains("3 ranks do not form whole groups of"), "{e}");
        let e = err("model: m\ndecode: {ranks: [0, 1], data_parallel_size: 0}\n");
        assert_eq!(e.field.as_deref(), Some("decode.data_parallel_size"));
        // GPU pools with multi-GPU groups disaggregate (their KV moves through the host).
        let ok = "model: m\ndevice: cuda\nprefill: {ranks: [0, 1], tensor_parallel_size: 2}\ndecode: {ranks: [2]}\n";
        assert!(DeployConfig::from_yaml_str(ok).is_ok());
        let e = err("model: m\nsupervisor: {heartbeat_timeout_ms: 20}\n");
        assert_eq!(e.field.as_deref(), Some("supervisor.heartbeat_timeout_ms"), "{e}");
        assert!(e.message.contains("at least 500"), "{e}");
        let e = err("model: m\ndecode: {ranks: []}\n");
        assert_eq!(e.field.as_deref(), Some("decode.ranks"));
        let e = err("model: m\nkv_cache: {gpu_memory_utilization: 0.9}\n");
        assert!(e.message.contains("device: cuda"), "{e}");
        let e = err("model: m\ndevice: cuda\nkv_cache: {gpu_memory_utilization: 0.9, num_blocks: 10}\n");
        assert_eq!(e.line, Some(3));
        let e = err("model: m\ndtype: bfloat16\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("dtype"), Some(2)), "{e}");
        assert!(err("model: m\ndtype: float16\n").message.contains("unknown variant `float16`"));
        let e = err("model: m\nload_format: npcache\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("load_format"), Some(2)), "{e}");
        assert!(e.message.contains("unknown variant `npcache`"), "{e}");
        for (text, want) in
            [("auto", LoadFormat::Safetensors), ("safetensors", LoadFormat::Safetensors), ("dummy", LoadFormat::Dummy)]
        {
            let c = DeployConfig::from_yaml_str(&format!("model: m\nload_format: {text}\n")).unwrap();
            assert_eq!(c.load_format, want, "{text}");
        }
        let e = err("model: m\nprefill: {ranks: [3, 3]}\n");
        assert_eq!(e.field.as_deref(), Some("prefill.ranks[1]"));
        let e = err("model: m\nmax_model_len: 4096\nkv_cache: {block_size: 64, num_blocks: 8}\n");
        assert_eq!(e.field.as_deref(), Some("kv_cache.num_blocks"));
        let e = err("# router: x\nmodel: m\nrouter:\n  prefill_threshold: 0\n");
        assert_eq!(e.line, Some(4), "a commented key does not count");
    }

    #[test]
    fn a_missing_model_directory_is_reported() {
        let mut c = DeployConfig::from_yaml_str("model: no/such/dir\n").unwrap();
        let e = c.resolve_model(Some(std::path::Path::new("/tmp/x/configs/a.yaml"))).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("model"));
        assert!(e.message.contains("/tmp/x/no/such/dir"), "{e}");
    }
}
