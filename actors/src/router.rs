//! The router actor: conditional disaggregation. A prompt with at least `prefill_threshold`
//! uncached tokens goes to the prefill pool while that pool's queue is below
//! `max_prefill_queue`; every other prompt is prefilled on its decode rank. The decode rank is
//! chosen up front (most free KV blocks, then fewest sequences), the prefill rank by queued
//! tokens.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message};

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
}

impl Router {
    pub fn new(table: Arc<RankTable>, cfg: RouterConfig) -> Self {
        Router { table, cfg }
    }

    fn route(&self, ctx: Arc<ReqCtx>) -> Result<Route, ActorError> {
        // No prefix cache yet: every prompt token is uncached.
        let uncached = ctx.prompt.len();
        if uncached >= self.cfg.prefill_threshold && self.table.prefill_queue() < self.cfg.max_prefill_queue {
            if let (Some(p), Some(d)) = (self.table.choose_prefill(), self.table.choose_decode()) {
                self.table.dispatch_prefill(ctx, p, d)?;
                return Ok(Route::PrefillPool);
            }
        }
        self.table.dispatch_generate(ctx, None)?;
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
