//! A model's weights as the loader reads them: a checkpoint's files, or random tensors made one
//! decoder layer at a time (so host memory holds one layer's, never the model's).

use std::ops::Deref;
use std::path::Path;

use super::random::{self, TensorSpec};
use super::Checkpoint;
use crate::error::Result;
use crate::model::ModelConfig;

/// Where a model's weights come from (vLLM's `--load-format`; `auto` is `safetensors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// The directory's safetensors files (vLLM's `auto` and `safetensors`).
    #[default]
    #[serde(alias = "auto")]
    Safetensors,
    /// Random weights at the shapes and in the format `config.json` declares, made in memory
    /// ([`random`]); no weight file is read. For benchmarks of models not at hand.
    Dummy,
}

impl std::str::FromStr for LoadFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" | "safetensors" => Ok(LoadFormat::Safetensors),
            "dummy" => Ok(LoadFormat::Dummy),
            _ => Err(format!("unknown load format `{s}`: expected auto, safetensors or dummy")),
        }
    }
}

/// Seed of [`LoadFormat::Dummy`]'s weights (`gen-checkpoint`'s default seed, so a generated
/// checkpoint and the dummy weights of its config are the same model).
pub const DUMMY_SEED: u64 = 1;

/// The weights of the model in a directory.
pub enum Weights {
    Files(Checkpoint),
    /// The tensors outside the decoder layers, then each layer's.
    Random {
        dir: std::path::PathBuf,
        outside: Vec<TensorSpec>,
        layers: Vec<Vec<TensorSpec>>,
    },
}

/// The tensors of one part of the model: borrowed from the files, or random and owned.
pub enum Part<'a> {
    Shared(&'a Checkpoint),
    Owned(Checkpoint),
}

impl Deref for Part<'_> {
    type Target = Checkpoint;
    fn deref(&self) -> &Checkpoint {
        match self {
            Part::Shared(c) => c,
            Part::Owned(c) => c,
        }
    }
}

impl Weights {
    /// The weights of the model in `dir` (whose config is `cfg`) in `format`.
    pub fn open(dir: &Path, cfg: &ModelConfig, format: LoadFormat) -> Result<Self> {
        Ok(match format {
            LoadFormat::Safetensors => Weights::Files(Checkpoint::open(dir)?),
            LoadFormat::Dummy => {
                tracing::info!(dir = %dir.display(), "load_format dummy: random weights of config.json's shapes and format");
                let mut layers = vec![Vec::new(); cfg.num_hidden_layers];
                let mut outside = Vec::new();
                for s in random::specs(cfg) {
                    match random::layer_of(&s.name) {
                        Some(l) => layers[l].push(s),
                        None => outside.push(s),
                    }
                }
                Weights::Random { dir: dir.to_path_buf(), outside, layers }
            }
        })
    }

    /// The tensors of decoder layer `layer`, or (`None`) those outside the layers.
    pub fn part(&self, layer: Option<usize>) -> Part<'_> {
        match self {
            Weights::Files(c) => Part::Shared(c),
            Weights::Random { dir, outside, layers } => {
                let specs = match layer {
                    Some(l) => layers.get(l).cloned().unwrap_or_default(),
                    None => outside.clone(),
                };
                Part::Owned(Checkpoint::random(dir, specs, DUMMY_SEED))
            }
        }
    }

    /// Checkpoint tensors never read (random weights are made only when read: none).
    pub fn unread(&self) -> Vec<String> {
        match self {
            Weights::Files(c) => c.unread(),
            Weights::Random { .. } => Vec::new(),
        }
    }
}
