//! The router actor: conditional disaggregation. The decode rank is chosen first: the one caching
//! the longest prefix of the prompt unless it is much busier, else the most free KV blocks, then
//! the fewest sequences. A prompt with at least `prefill_threshold` tokens not cached there
//! (NVIDIA Dynamo's rule) goes to the prefill pool while that pool's queue is below
//! `max_prefill_queue`, to the prefill rank with the least queued plus uncached work; every other
//! prompt is prefilled on its decode rank.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message};
use cleave_engine::kv_cache::block_hashes;

use crate::config::RouterConfig;
use crate::error::ActorError;
use crate::request::ReqCtx;
use crate::table::RankTable;

/// Route a new request to its ranks.
#[derive(Message)]
#[rtype(result = "Result<Route, ActorError>")]
pub(crate) struct RouteRequest(pub Arc<ReqCtx>);

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Prefilled on a prefill rank, KV moved to a decode rank.
    PrefillPool,
    /// Prefilled and decoded on one decode rank.
    DecodeLocal,
}

impl Route {
    /// The `route` label of `cleave_router_requests_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::PrefillPool => "prefill_pool",
            Route::DecodeLocal => "decode_local",
        }
    }
}

pub(crate) struct Router {
    table: Arc<RankTable>,
    cfg: RouterConfig,
    /// Whether the ranks cache prefixes (else prompts are not hashed).
    caching: bool,
}

impl Router {
    pub fn new(table: Arc<RankTable>, cfg: RouterConfig, caching: bool) -> Self {
        Router { table, cfg, caching }
    }

    fn route(&self, ctx: Arc<ReqCtx>) -> Result<Route, ActorError> {
        let hashes = if self.caching { block_hashes(&ctx.prompt, self.table.block_size) } else { Vec::new() };
        let decode = self.table.choose_decode_for(&hashes);
        let cached = decode.map_or(0, |(_, blocks)| blocks * self.table.block_size);
        let uncached = ctx.prompt.len().saturating_sub(cached);
        if uncached >= self.cfg.prefill_threshold && self.table.prefill_queue() < self.cfg.max_prefill_queue {
            if let (Some(p), Some((d, _))) = (self.table.choose_prefill_for(&hashes, ctx.prompt.len()), decode) {
                self.table.dispatch_prefill(ctx, p, d)?;
                return Ok(Route::PrefillPool);
            }
        }
        self.table.dispatch_generate(ctx, decode.map(|(d, _)| d))?;
        Ok(Route::DecodeLocal)
    }
}

impl Actor for Router {
    type Context = Context<Self>;
}

impl Handler<RouteRequest> for Router {
    type Result = Result<Route, ActorError>;

    fn handle(&mut self, m: RouteRequest, _: &mut Context<Self>) -> Self::Result {
        let id = m.0.id;
        let route = self.route(m.0)?;
        tracing::debug!(request_id = id, route = route.as_str(), "routed");
        self.table.metrics.router_requests.with_label_values(&[route.as_str()]).inc();
        Ok(route)
    }
}
