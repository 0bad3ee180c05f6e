//! HTTP client for OpenAI-compatible servers: model discovery, the vLLM-shaped `/tokenize` and
//! `/detokenize` endpoints, and (in [`request`]) the timed streaming request.

pub mod request;
pub mod sse;

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};

pub use request::{send_request, Endpoint, Prompt, RequestInput, RequestOutput};

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Deserialize)]
pub struct ModelInfo {
    /// The name to send as `model`.
    pub id: String,
    /// The checkpoint the served name points at (vLLM's `root`), if the server says.
    #[serde(default)]
    pub root: Option<String>,
    /// The context length, if the server says.
    #[serde(default)]
    pub max_model_len: Option<usize>,
}

/// A connection pool to one server (`base_url` is scheme + host + port, no path).
#[derive(Debug, Clone)]
pub struct ApiClient {
    /// The underlying pool; request functions share it.
    pub http: reqwest::Client,
    /// e.g. `http://127.0.0.1:8000`, without a trailing slash.
    pub base_url: String,
}

impl ApiClient {
    /// Builds a pool with no proxy (benchmarks talk to the server directly), no total timeout
    /// beyond vLLM's six hours, and unlimited idle connections.
    pub fn new(base_url: &str) -> Result<Self> {
        Self::with_headers(base_url, &[])
    }

    /// [`ApiClient::new`] sending `headers` with every request.
    pub fn with_headers(base_url: &str, headers: &[(String, String)]) -> Result<Self> {
        let mut map = reqwest::header::HeaderMap::new();
        for (k, v) in headers {
            let name =
                reqwest::header::HeaderName::from_bytes(k.as_bytes()).with_context(|| format!("header name {k:?}"))?;
            let value = reqwest::header::HeaderValue::from_str(v).with_context(|| format!("header {k}: value"))?;
            map.append(name, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(map)
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(usize::MAX)
            .timeout(Duration::from_secs(6 * 60 * 60))
            .connect_timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        Ok(Self { http, base_url: base_url.trim_end_matches('/').to_string() })
    }

    /// `base_url` + `path` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// `GET /v1/models`: the served models, first one first.
    pub async fn models(&self) -> Result<Vec<ModelInfo>> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<ModelInfo>,
        }
        let url = self.url("/v1/models");
        let resp = self.http.get(&url).send().await.with_context(|| format!("GET {url}"))?;
        let list: List = json_or_error(resp, &url).await?;
        Ok(list.data)
    }

    /// The first served model (vLLM's default for `--model`).
    pub async fn first_model(&self) -> Result<ModelInfo> {
        self.models()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("no models found on the server at {}", self.base_url))
    }

    /// `POST /tokenize {"model", "prompt", "add_special_tokens"}` -> `tokens`.
    pub async fn tokenize(&self, model: &str, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        #[derive(Deserialize)]
        struct Tokens {
            tokens: Vec<u32>,
        }
        let url = self.url("/tokenize");
        let body = json!({"model": model, "prompt": text, "add_special_tokens": add_special_tokens});
        let resp = self.http.post(&url).json(&body).send().await.with_context(|| format!("POST {url}"))?;
        Ok(json_or_error::<Tokens>(resp, &url).await?.tokens)
    }

    /// `POST /detokenize {"model", "tokens"}` -> `prompt`.
    pub async fn detokenize(&self, model: &str, tokens: &[u32]) -> Result<String> {
        #[derive(Deserialize)]
        struct Text {
            prompt: String,
        }
        let url = self.url("/detokenize");
        let body = json!({"model": model, "tokens": tokens});
        let resp = self.http.post(&url).json(&body).send().await.with_context(|| format!("POST {url}"))?;
        Ok(json_or_error::<Text>(resp, &url).await?.prompt)
    }
}

/// Parses a 2xx JSON body, or turns the status and the start of the body into an error.
async fn json_or_error<T: serde::de::DeserializeOwned>(resp: reqwest::Response, url: &str) -> Result<T> {
    let status = resp.status();
    let bytes = resp.bytes().await.with_context(|| format!("reading the body of {url}"))?;
    if !status.is_success() {
        bail!("{url}: HTTP {status}: {}", snippet(&bytes));
    }
    serde_json::from_slice(&bytes).with_context(|| format!("{url}: unexpected body {}", snippet(&bytes)))
}

/// The first 300 characters of a body, for error messages.
pub fn snippet(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s.chars().take(300).collect();
    if s.chars().count() > 300 {
        out.push_str("...");
    }
    out
}

/// A server's OpenAI error body (`{"error": {"message": ...}}`) as one line, or the raw text.
pub fn error_message(v: &Value) -> String {
    match v.get("error") {
        Some(Value::Object(e)) => {
            e.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| v.to_string())
        }
        Some(Value::String(s)) => s.clone(),
        _ => v.to_string(),
    }
}
