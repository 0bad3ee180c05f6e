//! `vllm serve`'s command-line names over a deployment: what `cleave serve MODEL
//! --tensor-parallel-size 8 --max-num-seqs 128 ...` means as a [`DeployConfig`]. Flags override
//! the YAML of `--config`; without one they start from [`DeployConfig::for_model`]. A value a flag
//! set that fails validation is reported under the flag's name.

use std::path::PathBuf;

use cleave_engine::weights::LoadFormat;

use super::{ConfigError, DeployConfig, Device, Dtype};

/// The flags of `cleave serve`, each `None` when not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeFlags {
    /// The positional MODEL (a Hugging Face checkpoint directory).
    pub model: Option<PathBuf>,
    pub served_model_name: Option<String>,
    pub device: Option<Device>,
    pub dtype: Option<Dtype>,
    pub max_model_len: Option<usize>,
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching`.
    pub enable_prefix_caching: Option<bool>,
    /// vLLM's `--enforce-eager` (given: on).
    pub enforce_eager: bool,
    /// vLLM's `--load-format`.
    pub load_format: Option<LoadFormat>,
    /// vLLM's `--chat-template` (a file or the template itself).
    pub chat_template: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Both pools' (vLLM's: per engine).
    pub max_num_seqs: Option<usize>,
    /// Both pools' token budget per step.
    pub max_num_batched_tokens: Option<usize>,
    /// Replaces `kv_cache.num_blocks`.
    pub gpu_memory_utilization: Option<f64>,
    /// vLLM's `--num-gpu-blocks-override`: blocks per rank, replacing the memory fraction.
    pub num_gpu_blocks_override: Option<usize>,
    pub block_size: Option<usize>,
    /// The decode pool's group shape, and the prefill pool's unless its own flags say otherwise.
    pub tensor_parallel_size: Option<usize>,
    pub data_parallel_size: Option<usize>,
    pub enable_expert_parallel: Option<bool>,
    /// The split: ranks of each pool (an empty prefill list serves colocated).
    pub prefill_ranks: Option<Vec<usize>>,
    pub decode_ranks: Option<Vec<usize>>,
    pub prefill_tensor_parallel_size: Option<usize>,
    pub prefill_data_parallel_size: Option<usize>,
    /// Prompts with at least this many tokens go to the prefill pool.
    pub prefill_threshold: Option<usize>,
    /// No periodic stats lines in the log (vLLM's `--disable-log-stats`).
    pub disable_log_stats: bool,
    /// Origins browsers may call the API from (vLLM's `--allowed-origins`).
    pub allowed_origins: Option<Vec<String>>,
}

/// Which flag sets which config field, and whether it was given (for error messages).
type Given = fn(&ServeFlags) -> bool;
const FLAG_OF: &[(&str, &str, Given)] = &[
    ("served_model_name", "--served-model-name", |f| f.served_model_name.is_some()),
    ("max_model_len", "--max-model-len", |f| f.max_model_len.is_some()),
    ("dtype", "--dtype", |f| f.dtype.is_some()),
    ("server.host", "--host", |f| f.host.is_some()),
    ("decode.max_num_seqs", "--max-num-seqs", |f| f.max_num_seqs.is_some()),
    ("prefill.max_num_seqs", "--max-num-seqs", |f| f.max_num_seqs.is_some()),
    ("decode.max_num_batched_tokens", "--max-num-batched-tokens", |f| f.max_num_batched_tokens.is_some()),
    ("prefill.max_num_batched_tokens", "--max-num-batched-tokens", |f| f.max_num_batched_tokens.is_some()),
    ("kv_cache.gpu_memory_utilization", "--gpu-memory-utilization", |f| f.gpu_memory_utilization.is_some()),
    ("kv_cache.num_blocks", "--num-gpu-blocks-override", |f| f.num_gpu_blocks_override.is_some()),
    ("kv_cache.block_size", "--block-size", |f| f.block_size.is_some()),
    ("decode.tensor_parallel_size", "--tensor-parallel-size", |f| f.tensor_parallel_size.is_some()),
    ("decode.data_parallel_size", "--data-parallel-size", |f| f.data_parallel_size.is_some()),
    ("prefill.tensor_parallel_size", "--prefill-tensor-parallel-size", |f| {
        f.prefill_tensor_parallel_size.is_some() || f.tensor_parallel_size.is_some()
    }),
    ("prefill.data_parallel_size", "--prefill-data-parallel-size", |f| {
        f.prefill_data_parallel_size.is_some() || f.data_parallel_size.is_some()
    }),
    ("prefill.ranks", "--prefill-ranks", |f| f.prefill_ranks.is_some()),
    ("decode.ranks", "--decode-ranks", |f| f.decode_ranks.is_some()),
    ("router.prefill_threshold", "--prefill-threshold", |f| f.prefill_threshold.is_some()),
];

/// `dst = v` when the flag was given.
fn set<T: Clone>(dst: &mut T, v: &Option<T>) {
    if let Some(v) = v {
        *dst = v.clone();
    }
}

fn flag_error(message: String) -> ConfigError {
    ConfigError { file: None, field: None, line: None, message }
}

impl ServeFlags {
    /// The deployment: `base` (from `--config`) or the defaults for the MODEL, with every flag
    /// given applied, the model directory resolved and the result validated.
    pub fn apply(&self, base: Option<DeployConfig>) -> Result<DeployConfig, ConfigError> {
        let from_file = base.is_some();
        let mut cfg = match (base, &self.model) {
            (Some(mut c), m) => {
                if let Some(m) = m {
                    c.model = m.clone();
                }
                c
            }
            (None, Some(m)) => DeployConfig::for_model(m.clone()),
            (None, None) => return Err(flag_error("give a MODEL directory or --config FILE".into())),
        };
        self.apply_fields(&mut cfg, from_file);
        if let Err(e) = cfg.check() {
            return Err(self.blame_flag(e));
        }
        if self.model.is_some() || !from_file {
            cfg.resolve_model(None)?;
        }
        Ok(cfg)
    }

    fn apply_fields(&self, cfg: &mut DeployConfig, from_file: bool) {
        if self.served_model_name.is_some() {
            cfg.served_model_name = self.served_model_name.clone();
        }
        set(&mut cfg.device, &self.device);
        set(&mut cfg.dtype, &self.dtype);
        if self.max_model_len.is_some() {
            cfg.max_model_len = self.max_model_len;
        }
        set(&mut cfg.enable_prefix_caching, &self.enable_prefix_caching);
        cfg.enforce_eager |= self.enforce_eager;
        set(&mut cfg.load_format, &self.load_format);
        if self.chat_template.is_some() {
            cfg.chat_template = self.chat_template.clone();
        }
        set(&mut cfg.server.host, &self.host);
        set(&mut cfg.server.port, &self.port);
        set(&mut cfg.server.allowed_origins, &self.allowed_origins);
        for (seqs, tokens) in [
            (&mut cfg.decode.max_num_seqs, &mut cfg.decode.max_num_batched_tokens),
            (&mut cfg.prefill.max_num_seqs, &mut cfg.prefill.max_num_batched_tokens),
        ] {
            set(seqs, &self.max_num_seqs);
            set(tokens, &self.max_num_batched_tokens);
        }
        let kv = &mut cfg.kv_cache;
        if let Some(f) = self.gpu_memory_utilization {
            (kv.gpu_memory_utilization, kv.num_blocks) = (Some(f), None);
        }
        if let Some(n) = self.num_gpu_blocks_override {
            (kv.gpu_memory_utilization, kv.num_blocks) = (None, Some(n));
        }
        set(&mut kv.block_size, &self.block_size);
        set(&mut cfg.router.prefill_threshold, &self.prefill_threshold);
        if self.disable_log_stats {
            cfg.supervisor.log_stats_interval_ms = 0;
        }

        let d = &mut cfg.decode;
        set(&mut d.tensor_parallel_size, &self.tensor_parallel_size);
        set(&mut d.data_parallel_size, &self.data_parallel_size);
        set(&mut d.enable_expert_parallel, &self.enable_expert_parallel);
        let p = &mut cfg.prefill;
        set(&mut p.ranks, &self.prefill_ranks);
        set(&mut p.tensor_parallel_size, &self.prefill_tensor_parallel_size);
        set(&mut p.data_parallel_size, &self.prefill_data_parallel_size);
        if !p.ranks.is_empty() {
            // The shared shape flags describe the prefill pool's groups too, unless its own do.
            if self.prefill_tensor_parallel_size.is_none() {
                set(&mut p.tensor_parallel_size, &self.tensor_parallel_size);
            }
            if self.prefill_data_parallel_size.is_none() {
                set(&mut p.data_parallel_size, &self.data_parallel_size);
            }
            set(&mut p.enable_expert_parallel, &self.enable_expert_parallel);
        }
        match &self.decode_ranks {
            Some(r) => d.ranks = r.clone(),
            // Without a file, one decode group on the ranks after the prefill pool's.
            None if !from_file || self.tensor_parallel_size.is_some() || self.data_parallel_size.is_some() => {
                let first = p.ranks.iter().max().map_or(0, |m| m + 1);
                d.ranks = (first..first + d.tensor_parallel_size.max(1) * d.data_parallel_size.max(1)).collect();
            }
            None => {}
        }
    }

    /// Names the flag behind a field the validation refused, when a flag set it.
    fn blame_flag(&self, mut e: ConfigError) -> ConfigError {
        if let Some(field) = &e.field {
            let base = field.split('[').next().unwrap_or(field);
            if let Some((_, flag, _)) = FLAG_OF.iter().find(|(f, _, given)| *f == base && given(self)) {
                e.field = Some(flag.to_string());
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-r1"))
    }

    #[test]
    fn a_model_and_vllm_flags_make_a_colocated_group() {
        let f = ServeFlags {
            model: Some(tiny()),
            tensor_parallel_size: Some(2),
            data_parallel_size: Some(2),
            enable_expert_parallel: Some(true),
            max_num_seqs: Some(128),
            max_model_len: Some(8000),
            served_model_name: Some("r1".into()),
            port: Some(9000),
            load_format: Some(LoadFormat::Dummy),
            ..Default::default()
        };
        let c = f.apply(None).unwrap();
        assert_eq!(c.load_format, LoadFormat::Dummy);
        assert_eq!(c.decode.ranks, vec![0, 1, 2, 3]);
        assert_eq!((c.decode.tensor_parallel_size, c.decode.data_parallel_size), (2, 2));
        assert!(c.decode.enable_expert_parallel && c.prefill.ranks.is_empty());
        assert_eq!((c.decode.max_num_seqs, c.max_model_len, c.server.port), (128, Some(8000), 9000));
        assert_eq!(c.served_model_name(), "r1");
        // The printed deployment reads back as the same one.
        assert_eq!(DeployConfig::from_yaml_str(&c.to_yaml()).unwrap(), c);
    }

    #[test]
    fn the_split_puts_decode_ranks_after_the_prefill_ranks() {
        let f = ServeFlags {
            model: Some(tiny()),
            prefill_ranks: Some(vec![0, 1, 2, 3]),
            tensor_parallel_size: Some(4),
            prefill_threshold: Some(1024),
            ..Default::default()
        };
        let c = f.apply(None).unwrap();
        assert_eq!((c.prefill.ranks.clone(), c.decode.ranks.clone()), (vec![0, 1, 2, 3], vec![4, 5, 6, 7]));
        assert_eq!((c.prefill.tensor_parallel_size, c.router.prefill_threshold), (4, 1024));
    }

    #[test]
    fn flags_override_the_file_and_errors_name_the_flag() {
        let base = DeployConfig::from_yaml_str(
            "model: m\ndevice: cuda\nkv_cache: {num_blocks: 100}\ndecode: {ranks: [2, 3], max_num_seqs: 8}\n",
        )
        .unwrap();
        let f = ServeFlags { max_num_seqs: Some(64), gpu_memory_utilization: Some(0.8), ..Default::default() };
        let c = f.apply(Some(base.clone())).unwrap();
        assert_eq!((c.decode.ranks.clone(), c.decode.max_num_seqs), (vec![2, 3], 64));
        assert_eq!((c.kv_cache.gpu_memory_utilization, c.kv_cache.num_blocks), (Some(0.8), None));
        let e = ServeFlags { max_num_seqs: Some(0), ..Default::default() }.apply(Some(base.clone())).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("--max-num-seqs"), "{e}");
        let e = ServeFlags { decode_ranks: Some(vec![0, 1, 2]), tensor_parallel_size: Some(2), ..Default::default() }
            .apply(Some(base))
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("--decode-ranks"), "{e}");
        assert!(e.message.contains("whole groups"), "{e}");
        let e = ServeFlags::default().apply(None).unwrap_err();
        assert!(e.to_string().contains("MODEL"), "{e}");
        let e = ServeFlags { model: Some("/no/such/model".into()), ..Default::default() }.apply(None).unwrap_err();
        assert!(e.to_string().contains("/no/such/model"), "{e}");
    }
}
