//! `cleave-bench batch`: send a list of tagged chat prompts (optionally with a system prompt) with
//! a concurrency cap, and write the answers in input order with reasoning and content apart.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::bench::{self, write_json};
use crate::cli::BatchArgs;
use crate::client::{Endpoint, Prompt, RequestInput, RequestOutput};
use crate::runner::{progress_bar, Target};

/// One input prompt.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchItem {
    /// Caller's identifier, copied to the output (any JSON value).
    pub tag: Value,
    /// The user message.
    pub prompt: String,
    /// An optional system message, sent first.
    #[serde(default)]
    pub system: Option<String>,
}

/// One answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BatchResponse {
    /// The input's tag.
    pub tag: Value,
    /// `reasoning_content`, or null when none came.
    pub reasoning: Option<String>,
    /// `content`, or null when none came (e.g. the length ran out inside the reasoning).
    pub content: Option<String>,
    /// `stop` or `length`, when the server said.
    pub finish_reason: Option<String>,
    /// The usage chunk, when the server sent it.
    pub usage: Option<Value>,
    /// Why the request failed, null on success.
    pub error: Option<String>,
}

/// Reads the input list.
pub fn load_items(path: &Path) -> Result<Vec<BatchItem>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: expected a JSON list of {{\"tag\", \"prompt\", \"system\"?}}", path.display()))
}

/// The chat messages of an item.
pub fn messages(item: &BatchItem) -> Vec<Value> {
    let mut m = vec![];
    if let Some(s) = &item.system {
        m.push(json!({"role": "system", "content": s}));
    }
    m.push(json!({"role": "user", "content": item.prompt}));
    m
}

/// The answer recorded for one output.
pub fn response_of(tag: Value, o: &RequestOutput) -> BatchResponse {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    BatchResponse {
        tag,
        reasoning: some(&o.reasoning_text),
        content: some(&o.generated_text),
        finish_reason: o.finish_reason.clone(),
        usage: o.usage.clone(),
        error: (!o.success).then(|| o.error.clone()),
    }
}

/// Sends every item and returns the answers in input order.
pub async fn run(target: &Target, items: &[BatchItem], args: &BatchArgs) -> Result<Vec<BatchResponse>> {
    if args.max_concurrency == 0 {
        bail!("--max-concurrency must be greater than 0");
    }
    let extra = args.server.extra_body()?;
    let pb = progress_bar(items.len(), !args.disable_tqdm);
    let epoch = Instant::now();
    let out: Vec<BatchResponse> = futures::stream::iter(items.iter())
        .map(|item| {
            let input = RequestInput {
                prompt: Prompt::Messages(messages(item)),
                prompt_len: 0,
                output_len: args.max_tokens,
                ignore_eos: false,
                extra_body: extra.clone(),
            };
            let pb = pb.clone();
            async move {
                let o = target.send(&input, epoch).await;
                pb.inc(1);
                response_of(item.tag.clone(), &o)
            }
        })
        .buffered(args.max_concurrency)
        .collect()
        .await;
    pb.finish_and_clear();
    Ok(out)
}

/// `cleave-bench batch`.
pub async fn main(args: BatchArgs) -> Result<()> {
    let items = load_items(&args.input)?;
    let mut server = args.server.clone();
    if Endpoint::from_path(&server.endpoint()) != Endpoint::Chat {
        server.endpoint = Some("/v1/chat/completions".into());
    }
    let (target, _) = bench::resolve_target(&server).await?;
    let start = Instant::now();
    let responses = run(&target, &items, &args).await?;
    write_json(&args.output, &serde_json::to_value(&responses)?)?;
    let failed = responses.iter().filter(|r| r.error.is_some()).count();
    println!(
        "{} prompts, {} answered, {} failed, in {:.2} s; wrote {}",
        responses.len(),
        responses.len() - failed,
        failed,
        start.elapsed().as_secs_f64(),
        args.output.display()
    );
    for r in responses.iter().filter(|r| r.error.is_some()).take(10) {
        println!("Error for tag {}: {}", r.tag, r.error.as_deref().unwrap_or(""));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_and_responses() {
        let items: Vec<BatchItem> =
            serde_json::from_str(r#"[{"tag": "a", "prompt": "hi", "system": "be brief"}, {"tag": 2, "prompt": "yo"}]"#)
                .unwrap();
        assert_eq!(
            messages(&items[0]),
            vec![json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "hi"})]
        );
        assert_eq!(messages(&items[1]).len(), 1);
        let o = RequestOutput {
            success: true,
            reasoning_text: "think".into(),
            finish_reason: Some("length".into()),
            ..Default::default()
        };
        let r = response_of(json!("a"), &o);
        assert_eq!((r.reasoning.as_deref(), r.content.as_deref(), r.error.as_deref()), (Some("think"), None, None));
        let f = RequestOutput { success: false, error: "HTTP 400".into(), ..Default::default() };
        assert_eq!(response_of(json!(1), &f).error.as_deref(), Some("HTTP 400"));
    }
}
