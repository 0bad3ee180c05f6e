//! One benchmark run from options to report: resolve the model, build the prompts, check the
//! endpoint, send, measure, print, save.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::cli::{BenchArgs, DatasetKind, ServerArgs, WorkloadArgs};
use crate::client::{ApiClient, Endpoint, RequestInput, RequestOutput};
use crate::dataset::{self, LocalTokenizer, PromptTokenizer, RandomSpec, SampleRequest, ServerTokenizer};
use crate::metrics::{self, Goodput, Metrics};
use crate::report::{self, RunMeta};
use crate::runner::{self, LoadSpec, RunOutcome, Target};

/// Connects to the server and settles the model: `--model`, or the first of `/v1/models`.
/// Also returns the server's `max_model_len` when it says.
pub async fn resolve_target(server: &ServerArgs) -> Result<(Target, Option<usize>)> {
    let base_url = server.base_url();
    let client = ApiClient::with_headers(&base_url, &server.headers()?)?;
    let endpoint = Endpoint::from_path(&server.endpoint());
    let listed = client.models().await;
    let (model, max_len) = match (&server.model, listed) {
        (Some(m), Ok(list)) => {
            let len = list.iter().find(|x| &x.id == m).and_then(|x| x.max_model_len);
            (m.clone(), len)
        }
        (Some(m), Err(_)) => (m.clone(), None),
        (None, Ok(list)) => {
            let first =
                list.into_iter().next().with_context(|| format!("no models found on the server at {base_url}"))?;
            println!("Model not specified, using the first model of the server: {}", first.id);
            (first.id, first.max_model_len)
        }
        (None, Err(e)) => return Err(e.context("fetching the first model from /v1/models (or pass --model)")),
    };
    let api_url = client.url(&server.endpoint());
    Ok((Target { client, endpoint, api_url, model }, max_len))
}

/// The tokenizer prompts are built with: the local one at `path`, else the server's.
pub fn prompt_tokenizer<'a>(target: &'a Target, path: Option<&Path>) -> Result<PromptTokenizer<'a>> {
    Ok(match path {
        Some(path) => PromptTokenizer::Local(LocalTokenizer::load(path)?),
        None => PromptTokenizer::Server(ServerTokenizer { client: &target.client, model: target.model.clone() }),
    })
}

/// Builds the prompts of a run.
pub async fn load_requests(
    target: &Target,
    w: &WorkloadArgs,
    num_prompts: usize,
    seed: u64,
    max_model_len: Option<usize>,
) -> Result<Vec<SampleRequest>> {
    let tok = &prompt_tokenizer(target, w.tokenizer.as_deref())?;
    match w.dataset {
        DatasetKind::Random => {
            if w.prompt_token_ids && target.endpoint == Endpoint::Chat {
                bail!("--prompt-token-ids needs --endpoint /v1/completions");
            }
            if let Some(max) = max_model_len {
                let need = w.random_prefix_len
                    + (w.random_input_len as f64 * (1.0 + w.random_range_ratio)).ceil() as usize
                    + (w.random_output_len as f64 * (1.0 + w.random_range_ratio)).ceil() as usize;
                if need > max {
                    eprintln!("WARNING: prompts of up to {need} tokens with output may exceed the server's max_model_len {max}");
                }
            }
            let spec = RandomSpec {
                input_len: w.random_input_len,
                prefix_len: w.random_prefix_len,
                output_len: w.random_output_len,
                range_ratio: w.random_range_ratio,
                num_prompts,
                token_id_range: w.token_id_range,
                as_token_ids: w.prompt_token_ids,
                seed,
            };
            dataset::random_requests(tok, &spec).await.context("building the random dataset")
        }
        DatasetKind::PrefixRepetition => {
            let spec = RandomSpec {
                input_len: w.prefix_repetition_suffix_len,
                prefix_len: w.prefix_repetition_prefix_len,
                output_len: w.prefix_repetition_output_len,
                range_ratio: 0.0,
                num_prompts,
                token_id_range: w.token_id_range,
                as_token_ids: w.prompt_token_ids,
                seed,
            };
            dataset::prefix_repetition_requests(tok, &spec, w.prefix_repetition_num_prefixes)
                .await
                .context("building the prefix_repetition dataset")
        }
        DatasetKind::Sharegpt => {
            let path = w.dataset_path.as_deref().context("--dataset-name sharegpt needs --dataset-path")?;
            crate::sharegpt::requests(tok, path, num_prompts, w.sharegpt_output_len, seed).await
        }
        DatasetKind::Jsonl => {
            let path = w.dataset_path.as_deref().context("--dataset jsonl needs --dataset-path")?;
            let all = dataset::load_jsonl(path, w.random_output_len)?;
            // A file shorter than --num-prompts wraps around, as vLLM oversamples.
            let mut reqs: Vec<SampleRequest> = all.iter().cycle().take(num_prompts).cloned().collect();
            dataset::count_prompt_tokens(tok, &mut reqs).await;
            Ok(reqs)
        }
    }
}

/// Request inputs for prompts.
pub fn to_inputs(
    reqs: &[SampleRequest],
    ignore_eos: bool,
    extra_body: &Option<Map<String, Value>>,
) -> Vec<RequestInput> {
    reqs.iter()
        .map(|r| RequestInput {
            prompt: r.prompt.clone(),
            prompt_len: r.prompt_len,
            output_len: r.output_len,
            ignore_eos,
            extra_body: extra_body.clone(),
        })
        .collect()
}

/// Fills in missing output counts (a server without a usage chunk) by tokenizing the text.
pub async fn fill_missing_output_counts(target: &Target, outputs: &mut [RequestOutput]) {
    for o in outputs.iter_mut().filter(|o| o.success && o.output_tokens.is_none()) {
        if let Ok(ids) = target.client.tokenize(&target.model, &o.full_text(), false).await {
            o.output_tokens = Some(ids.len());
        }
    }
}

/// A finished run with everything derived from it.
#[derive(Debug, Clone)]
pub struct BenchRun {
    /// Settings.
    pub meta: RunMeta,
    /// Numbers.
    pub metrics: Metrics,
    /// Raw outputs.
    pub outcome: RunOutcome,
    /// The result JSON.
    pub result: Value,
    /// The printed report (failures first).
    pub report: String,
}

/// Checks the endpoint, warms up, runs one load point and computes its report.
pub async fn run_point(
    target: &Target,
    w: &WorkloadArgs,
    extra_body: &Option<Map<String, Value>>,
    reqs: &[SampleRequest],
    load: &LoadSpec,
    label: Option<String>,
) -> Result<BenchRun> {
    let pcts = w.percentiles()?;
    let selected = w.selected_metrics()?;
    let goodput = Goodput::parse(&w.goodput)?;
    // vLLM always ignores EOS on the random dataset so outputs reach the asked length.
    let ignore_eos = w.ignore_eos || w.dataset == DatasetKind::Random;
    let inputs = to_inputs(reqs, ignore_eos, extra_body);
    let first = inputs.first().context("no prompts to send")?;
    println!("Starting initial single prompt test run...");
    runner::ready_check(target, first, w.ready_check_timeout_sec).await?;
    println!("Initial test run completed.");
    if w.num_warmups > 0 {
        println!("Warming up with {} requests...", w.num_warmups);
        let warm = vec![first.clone(); w.num_warmups];
        let load = LoadSpec { request_rate: f64::INFINITY, ..load.clone() };
        runner::run(target, warm, &load, !w.disable_tqdm).await?;
        println!("Warmup run completed.");
    }
    println!("Starting main benchmark run...");
    // Python's float formatting, as vLLM prints them: 1.0, 40.0, inf.
    let py = |x: f64| if x.is_finite() { format!("{x:?}") } else { "inf".into() };
    println!("Traffic request rate: {}", py(load.request_rate));
    let dist = if load.burstiness == 1.0 { "Poisson process" } else { "Gamma distribution" };
    println!("Burstiness factor: {} ({dist})", py(load.burstiness));
    println!("Maximum request concurrency: {}", load.max_concurrency.map_or("None".to_string(), |c| c.to_string()));
    let mut outcome = runner::run(target, inputs, load, !w.disable_tqdm).await?;
    fill_missing_output_counts(target, &mut outcome.outputs).await;
    let metrics = metrics::calculate(&outcome.outputs, outcome.duration, &pcts, &goodput);
    let meta = RunMeta {
        label,
        model: target.model.clone(),
        endpoint: target.endpoint,
        num_prompts: reqs.len(),
        request_rate: load.request_rate,
        burstiness: load.burstiness,
        max_concurrency: load.max_concurrency,
    };
    let report = report::format_failures(&outcome.outputs)
        + &report::format_report(&meta, &metrics, outcome.duration, &selected);
    let result = report::result_json(&meta, &metrics, &outcome, &selected);
    Ok(BenchRun { meta, metrics, outcome, result, report })
}

/// Writes a JSON value to a file, creating parent directories.
pub fn write_json(path: &Path, v: &Value) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(v)?).with_context(|| format!("writing {}", path.display()))
}

/// `cleave-bench` with no subcommand.
pub async fn main(args: BenchArgs) -> Result<()> {
    let (target, max_len) = resolve_target(&args.server).await?;
    let extra = args.server.extra_body()?;
    let reqs = load_requests(&target, &args.workload, args.workload.num_prompts, args.workload.seed, max_len).await?;
    let load = LoadSpec {
        request_rate: args.request_rate,
        burstiness: args.workload.burstiness,
        max_concurrency: args.max_concurrency,
        seed: args.workload.seed,
    };
    let run = run_point(&target, &args.workload, &extra, &reqs, &load, args.label.clone()).await?;
    print!("{}", run.report);
    if let Some(path) = result_path(&args, &run.meta) {
        let mut result = run.result.clone();
        if !args.save_detailed {
            if let Value::Object(o) = &mut result {
                for k in DETAILED {
                    o.remove(*k);
                }
            }
        }
        write_json(&path, &result)?;
        println!("Result saved to {}", path.display());
    }
    Ok(())
}

/// The per-request arrays of a result, kept only with `--save-detailed` (as vLLM).
const DETAILED: &[&str] = &["input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"];

/// Where `--save-result` writes: its PATH, else RESULT_DIR/RESULT_FILENAME with vLLM's default
/// name `BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json`.
fn result_path(args: &BenchArgs, meta: &RunMeta) -> Option<std::path::PathBuf> {
    let explicit = args.save_result.as_ref()?;
    if let Some(p) = explicit {
        return Some(p.clone());
    }
    let name = args.result_filename.clone().unwrap_or_else(|| {
        let rate = if meta.request_rate.is_finite() { format!("{:?}", meta.request_rate) } else { "inf".into() };
        let conc = meta.max_concurrency.map_or(String::new(), |c| format!("-concurrency{c}"));
        let model = meta.model.rsplit('/').next().unwrap_or(&meta.model);
        format!("{}-{rate}qps{conc}-{model}-{}.json", args.server.backend_name(), report::now_stamp())
    });
    Some(args.result_dir.clone().unwrap_or_default().join(name))
}
