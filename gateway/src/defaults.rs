//! Sampling defaults for requests that leave a parameter out: OpenAI's (temperature 1, top_p 1),
//! overridden, as vLLM does, by the model directory's `generation_config.json` (R1 ships
//! temperature 0.6, top_p 0.95).

use std::path::Path;

/// Defaults applied to a request's unset sampling fields.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// `max_new_tokens` of the generation config; otherwise the context left after the prompt.
    pub max_tokens: Option<usize>,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        SamplingDefaults {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            max_tokens: None,
        }
    }
}

/// A `generation_config.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DefaultsError {
    pub path: String,
    pub message: String,
}

impl SamplingDefaults {
    /// Reads `<dir>/generation_config.json` when it exists; absent fields keep OpenAI's defaults.
    pub fn from_model_dir(dir: &Path) -> Result<Self, DefaultsError> {
        let path = dir.join("generation_config.json");
        let err = |message: String| DefaultsError { path: path.display().to_string(), message };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(err(e.to_string())),
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
        Self::from_json(&v).map_err(err)
    }

    /// Applies the fields of a parsed generation config.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let mut d = Self::default();
        let num = |key: &str| -> Result<Option<f64>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("`{key}` must be a number")),
            }
        };
        if let Some(t) = num("temperature")? {
            d.temperature = t as f32;
        }
        if let Some(p) = num("top_p")? {
            d.top_p = p as f32;
        }
        if let Some(k) = num("top_k")? {
            d.top_k = if k > 0.0 { k as usize } else { 0 };
        }
        if let Some(p) = num("min_p")? {
            d.min_p = p as f32;
        }
        if let Some(r) = num("repetition_penalty")? {
            d.repetition_penalty = r as f32;
        }
        if let Some(m) = num("max_new_tokens")? {
            d.max_tokens = (m >= 1.0).then_some(m as usize);
        }
        if d.temperature < 0.0 || !(d.top_p > 0.0 && d.top_p <= 1.0) || d.repetition_penalty <= 0.0 {
            return Err(format!("out-of-range sampling defaults: {d:?}"));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_config_overrides_openai_defaults() {
        let d = SamplingDefaults::from_json(&serde_json::json!({"temperature": 0.6, "top_p": 0.95, "do_sample": true}))
            .unwrap();
        assert_eq!((d.temperature, d.top_p, d.top_k), (0.6, 0.95, 0));
        let d = SamplingDefaults::from_model_dir(Path::new("/nonexistent")).unwrap();
        assert_eq!(d, SamplingDefaults::default());
        assert!(SamplingDefaults::from_json(&serde_json::json!({"top_p": 0})).is_err());
    }
}
