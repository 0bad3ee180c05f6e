//! CUDA graphs of decode steps, the backend's half: graph mode, its fixed input buffers and its
//! workspace. The generic half (which steps, padding, validation) is [`crate::graphs`].
//!
//! A captured step bakes in every address it used, so in graph mode:
//! - the step's index inputs (token ids, positions, slots, attention metadata, sampled rows) go
//!   to one fixed buffer per key, sized by [`GraphLimits`] and never reallocated; a replay
//!   rewrites their contents first ([`stage`]);
//! - activations and scratch come from a workspace of their own that frees nothing while graphs
//!   live. Every graph shares it: replays never overlap (one stream), and nothing a step leaves
//!   in scratch is read by the next one;
//! - attention is split for the longest context allowed, not the step's ([`GraphMode::max_ctx`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use cleave_kernels::graph::Graph;
use cleave_kernels::ptr;

use super::attention::absorbed_meta;
use super::pool::{class_bytes, Buf, Workspace};
use super::{kerr, CudaBackend, Upload};
use crate::backend::{GraphLimits, StepIndices};
use crate::error::{EngineError, Result};

/// A captured decode step.
pub struct CudaGraph {
    graph: Graph,
}

impl CudaGraph {
    /// Kernel, copy and GEMM nodes in the graph.
    pub fn nodes(&self) -> usize {
        self.graph.nodes()
    }
}

/// What graph mode needs while it is on.
pub(super) struct GraphMode {
    /// Longest context a row may have (attention splits are chosen for it).
    pub max_ctx: usize,
    /// Keys uploaded since graph mode began.
    used: Vec<&'static str>,
}

/// The backend's graph state: off, or on with its limits; the fixed inputs and workspace persist.
pub(super) struct GraphState {
    pub mode: RefCell<Option<GraphMode>>,
    /// The fixed input buffers, by key.
    inputs: RefCell<HashMap<&'static str, Upload>>,
    /// Buffers of captured steps (no idle cap: a freed one could be baked into a graph).
    pub ws: Rc<Workspace>,
}

impl GraphState {
    pub fn new() -> Self {
        let ws = Workspace::new();
        ws.set_cap(usize::MAX);
        GraphState { mode: RefCell::new(None), inputs: RefCell::new(HashMap::new()), ws }
    }

    pub fn active(&self) -> bool {
        self.mode.borrow().is_some()
    }

    pub fn max_ctx(&self) -> Option<usize> {
        self.mode.borrow().as_ref().map(|m| m.max_ctx)
    }

    /// Device bytes held for graphs: the workspace and the fixed inputs.
    pub fn bytes(&self) -> usize {
        let s = self.ws.stats();
        s.idle_bytes + self.inputs.borrow().values().map(|(_, b)| b.len() * 4).sum::<usize>()
    }
}

/// The keys the forward pass uploads per step, which [`stage`] writes before a replay, and the
/// values each key's buffer must hold for steps within `l`.
fn capacities(l: GraphLimits) -> [(&'static str, usize); 5] {
    let rows = l.max_rows;
    [("ids", rows), ("positions", rows), ("slots", rows), ("attn", rows * (2 + l.max_blocks)), ("gather", rows)]
}

impl CudaBackend {
    /// The fixed device copy of `data` under `key` (graph mode's `upload_u32`): written only
    /// when it differs from what the buffer holds; never reallocated.
    pub(super) fn graph_upload(&self, key: &'static str, data: &[u32]) -> Result<u64> {
        if let Some(m) = self.graphs.mode.borrow_mut().as_mut() {
            if !m.used.contains(&key) {
                m.used.push(key);
            }
        }
        let mut inputs = self.graphs.inputs.borrow_mut();
        let (held, buf) = inputs.get_mut(key).ok_or_else(|| {
            EngineError::Backend(format!("graph mode: the step uploads `{key}`, which has no fixed buffer"))
        })?;
        if held.as_slice() != data {
            if data.len() > buf.len() {
                return Err(EngineError::Backend(format!(
                    "graph mode: `{key}` of {} values exceeds its fixed buffer of {}",
                    data.len(),
                    buf.len()
                )));
            }
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { self.gpu.htod(data, ptr(buf)) }.map_err(kerr)?;
            held.clear();
            held.extend_from_slice(data);
        }
        Ok(ptr(buf))
    }

    /// Sizes the fixed input buffers for `l` (growing one drops what graphs captured before read).
    fn reserve_inputs(&self, l: GraphLimits) -> Result<()> {
        let mut inputs = self.graphs.inputs.borrow_mut();
        for (key, n) in capacities(l) {
            if inputs.get(key).is_some_and(|(_, b)| b.len() >= n) {
                continue;
            }
            let len = class_bytes(n.max(1) * 4) / 4;
            let buf = Buf::unpooled(self.gpu.alloc::<u32>(len).map_err(kerr)?);
            inputs.insert(key, (Vec::new(), buf));
        }
        Ok(())
    }
}

/// Runs `f` in graph mode (see the module docs), then leaves it, whatever `f` returned.
fn in_graph_mode<T>(be: &CudaBackend, max_ctx: usize, f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<&'static str>)> {
    *be.graphs.mode.borrow_mut() = Some(GraphMode { max_ctx, used: Vec::new() });
    let out = f();
    let used = be.graphs.mode.borrow_mut().take().map(|m| m.used).unwrap_or_default();
    Ok((out?, used))
}

/// [`crate::backend::Backend::capture_step`] on CUDA.
pub(super) fn capture<T>(be: &CudaBackend, l: GraphLimits, f: &mut dyn FnMut() -> Result<T>) -> Result<(CudaGraph, T)> {
    be.reserve_inputs(l)?;
    // The warm-up fills the workspace (and cuBLAS's heuristics) so that the capture allocates
    // nothing; its results are dropped, their buffers back in the graph workspace.
    let (warm, _) = in_graph_mode(be, l.max_ctx, &mut *f)?;
    drop(warm);
    be.sync()?;
    let misses = be.graphs.ws.stats().misses;
    let ((graph, out), used) = in_graph_mode(be, l.max_ctx, || be.gpu.capture(|| Ok(f())).map_err(kerr))?;
    let out = out?;
    if let Some(k) = used.iter().find(|k| !capacities(l).iter().any(|(staged, _)| staged == *k)) {
        return Err(EngineError::Backend(format!("graph capture: the step uploads `{k}`, which replays do not stage")));
    }
    if be.graphs.ws.stats().misses != misses {
        return Err(EngineError::Backend("graph capture: the captured run needed buffers its warm-up did not".into()));
    }
    Ok((CudaGraph { graph }, out))
}

/// [`crate::backend::Backend::stage_step`] on CUDA: the uploads the forward pass makes, in
/// graph mode, without running it.
pub(super) fn stage(be: &CudaBackend, s: &StepIndices<'_>) -> Result<()> {
    be.graph_upload("ids", s.ids)?;
    be.graph_upload("positions", s.positions)?;
    be.graph_upload("slots", s.slots)?;
    be.graph_upload("attn", &absorbed_meta(s.attn, s.ids.len(), |_| false).0)?;
    be.graph_upload("gather", s.sample_rows)?;
    Ok(())
}

/// [`crate::backend::Backend::replay`] on CUDA.
pub(super) fn replay(be: &CudaBackend, g: &CudaGraph) -> Result<()> {
    be.gpu.replay(&g.graph).map_err(kerr)
}
