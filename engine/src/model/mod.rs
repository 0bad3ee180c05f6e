//! The DeepSeek-V3/R1 architecture, written once over [`crate::backend::Backend`].

pub mod config;
mod deepseek;
mod load;
pub mod rope;

pub use config::{AwqConfig, ModelConfig, Quantization};
pub use deepseek::{LoadOptions, Model, StepInput};
