//! The DeepSeek-V3/R1 architecture, written once over [`crate::backend::Backend`].

pub mod config;
mod deepseek;
pub mod rope;

pub use config::{AwqConfig, ModelConfig, Quantization};
pub use deepseek::{Model, StepInput};
