//! `cleave-bench`: a load generator for OpenAI-compatible servers (cleave, vLLM, SGLang) that
//! measures exactly what `vllm bench serve` measures, plus sweeps with charts, a mixed
//! long-prefill / long-decode scenario, and a batch prompt sender. It talks HTTP only.

pub mod batch;
pub mod bench;
pub mod chart;
pub mod charts;
pub mod cli;
pub mod client;
pub mod dataset;
pub mod metrics;
pub mod mixed;
pub mod multi_turn;
pub mod points;
pub mod report;
pub mod runner;
pub mod sharegpt;
pub mod soak;
pub mod sweep;
