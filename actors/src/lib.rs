//! cleave's control plane: the router, the prefill and decode pools, the KV-transfer actor and
//! the metrics, over ranks that each own one engine.
//!
//! Threads: the actors run in an actix System on their own thread; every rank is one OS thread
//! that builds its engine (and device context) itself and never hands it to another thread. A
//! request's tokens go from its rank straight to its [`TokenStream`] over a flume channel; only
//! control messages go through actor mailboxes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cleave_actors::ActorError> {
//! use cleave_actors::{config::DeployConfig, Cluster, StreamEvent};
//! let cfg = DeployConfig::from_yaml_file("configs/cpu-tiny.yaml")?;
//! let cluster = Cluster::start(cfg)?;
//! let prompt = cluster.tokenizer().encode("1+1=", true).map_err(|e| cleave_actors::ActorError::Invalid(e.to_string()))?;
//! let mut stream = cluster.submit(prompt, cleave_engine::SamplingParams::greedy(16)).await?;
//! while let Some(ev) = stream.recv_async().await {
//!     match ev {
//!         StreamEvent::Token(t) => print!("{}", t.text),
//!         StreamEvent::Error(e) => eprintln!("{e}"),
//!     }
//! }
//! # Ok(()) }
//! ```

mod cluster;
mod command;
pub mod config;
mod error;
mod events;
mod ledger;
pub mod metrics;
mod pool;
mod prefix;
mod rank;
mod request;
mod router;
mod stats_line;
mod table;
mod transfer;
pub mod transport;

pub use cleave_engine::{SamplingParams, TokenOutput};
pub use cluster::{Cluster, ClusterStats, ModelInfo};
#[doc(hidden)]
pub use command::Fault;
pub use error::ActorError;
pub use rank::{CpuRankFactory, CudaRankFactory, RankFactory, RankInfo};
pub use request::{ReqId, StreamEvent, TokenStream};
pub use router::Route;
pub use table::{RankStats, RankStatus, Role};
