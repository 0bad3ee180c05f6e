//! The request fields that constrain the output, read into one engine [`Constraint`]:
//! OpenAI's `response_format` (`text`, `json_object`, `json_schema`), vLLM's `structured_outputs`
//! (`json`, `regex`, `choice`, `grammar`, `json_object`) and its older `guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`. At most one may be given; grammars are
//! llguidance's Lark syntax. The schema, regex or grammar itself is checked when the engine
//! compiles it (a 400 naming the problem).

use cleave_engine::structured::Constraint;
use serde_json::{Map, Value};

use crate::errors::ApiError;

fn schema_of(param: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| ApiError::field(param, format!("`{param}` is not a JSON schema: {e}")))
        }
        _ => Err(ApiError::field(param, format!("`{param}` must be a JSON schema (an object)"))),
    }
}

fn text_of(param: &str, v: &Value) -> Result<String, ApiError> {
    match v.as_str() {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(ApiError::field(param, format!("`{param}` must be a non-empty string"))),
    }
}

fn choices_of(param: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let list: Option<Vec<String>> =
        v.as_array().map(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect()).unwrap_or(None);
    match list {
        Some(l) if !l.is_empty() => Ok(l),
        _ => Err(ApiError::field(param, format!("`{param}` must be a non-empty list of strings"))),
    }
}

/// `response_format`.
fn response_format(v: &Value) -> Result<Option<Constraint>, ApiError> {
    let p = "response_format";
    let o = v.as_object().ok_or_else(|| ApiError::field(p, "`response_format` must be an object"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ApiError::field("response_format.json_schema", "`response_format.json_schema` must be an object")
            })?;
            let schema = js.get("schema").ok_or_else(|| {
                ApiError::field(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` is required",
                )
            })?;
            Ok(Some(Constraint::JsonSchema(schema_of("response_format.json_schema.schema", schema)?)))
        }
        Some(t) => Err(ApiError::field(
            "response_format.type",
            format!("`response_format.type` must be text, json_object or json_schema, got {t:?}"),
        )),
        None => Err(ApiError::field("response_format.type", "`response_format.type` is required")),
    }
}

/// One of vLLM's `structured_outputs` keys.
fn structured_outputs(o: &Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    let mut found = Vec::new();
    for (key, v) in o {
        let param = format!("structured_outputs.{key}");
        let c = match key.as_str() {
            "json" => Some(Constraint::JsonSchema(schema_of(&param, v)?)),
            "regex" => Some(Constraint::Regex(text_of(&param, v)?)),
            "choice" => Some(Constraint::Choice(choices_of(&param, v)?)),
            "grammar" => Some(Constraint::Grammar(text_of(&param, v)?)),
            "json_object" => (v.as_bool() == Some(true)).then_some(Constraint::JsonObject),
            // Options of vLLM's own backends that change nothing here.
            "disable_any_whitespace" | "disable_fallback" | "disable_additional_properties" | "whitespace_pattern" => {
                return Err(ApiError::field(&param, format!("`{param}` is not supported")))
            }
            _ => return Err(ApiError::field(&param, format!("unknown structured output `{key}`"))),
        };
        found.extend(c);
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::field("structured_outputs", "give only one of json, regex, choice, grammar, json_object")),
    }
}

/// The constraint a request's body asks for, if any.
pub fn constraint(body: &Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    let mut given: Vec<(&str, Constraint)> = Vec::new();
    let present = |k: &str| body.get(k).filter(|v| !v.is_null());
    if let Some(v) = present("response_format") {
        given.extend(response_format(v)?.map(|c| ("response_format", c)));
    }
    if let Some(v) = present("structured_outputs") {
        let o = v
            .as_object()
            .ok_or_else(|| ApiError::field("structured_outputs", "`structured_outputs` must be an object"))?;
        given.extend(structured_outputs(o)?.map(|c| ("structured_outputs", c)));
    }
    if let Some(v) = present("guided_json") {
        given.push(("guided_json", Constraint::JsonSchema(schema_of("guided_json", v)?)));
    }
    if let Some(v) = present("guided_regex") {
        given.push(("guided_regex", Constraint::Regex(text_of("guided_regex", v)?)));
    }
    if let Some(v) = present("guided_choice") {
        given.push(("guided_choice", Constraint::Choice(choices_of("guided_choice", v)?)));
    }
    if let Some(v) = present("guided_grammar") {
        given.push(("guided_grammar", Constraint::Grammar(text_of("guided_grammar", v)?)));
    }
    if let Some(v) = present("guided_decoding_backend") {
        match v.as_str() {
            Some("auto" | "guidance" | "llguidance") => {}
            _ => {
                return Err(ApiError::field(
                    "guided_decoding_backend",
                    "`guided_decoding_backend` must be auto or guidance (llguidance is the only backend)",
                ))
            }
        }
    }
    match given.len() {
        0 | 1 => Ok(given.pop().map(|(_, c)| c)),
        _ => Err(ApiError::field(
            given[1].0,
            format!("`{}` and `{}` both constrain the output; give one", given[0].0, given[1].0),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn c(v: Value) -> Result<Option<Constraint>, ApiError> {
        constraint(v.as_object().unwrap())
    }

    fn param(e: ApiError) -> String {
        match e {
            ApiError::InvalidField { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_spelling_reads_into_one_constraint() {
        let schema = json!({"type": "object"});
        assert_eq!(c(json!({})).unwrap(), None);
        assert_eq!(c(json!({"response_format": {"type": "text"}})).unwrap(), None);
        assert_eq!(c(json!({"response_format": {"type": "json_object"}})).unwrap(), Some(Constraint::JsonObject));
        let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}});
        assert_eq!(c(rf).unwrap(), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(
            c(json!({"guided_json": "{\"type\": \"object\"}"})).unwrap(),
            Some(Constraint::JsonSchema(schema.clone()))
        );
        assert_eq!(c(json!({"structured_outputs": {"regex": "a+"}})).unwrap(), Some(Constraint::Regex("a+".into())));
        assert_eq!(
            c(json!({"guided_choice": ["a", "b"], "guided_decoding_backend": "auto"})).unwrap(),
            Some(Constraint::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            c(json!({"structured_outputs": {"grammar": "start: \"x\""}})).unwrap(),
            Some(Constraint::Grammar("start: \"x\"".into()))
        );
    }

    #[test]
    fn bad_or_conflicting_fields_name_themselves() {
        assert_eq!(param(c(json!({"response_format": {"type": "yaml"}})).unwrap_err()), "response_format.type");
        assert_eq!(
            param(c(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})).unwrap_err()),
            "response_format.json_schema.schema"
        );
        assert_eq!(param(c(json!({"guided_json": "{not json"})).unwrap_err()), "guided_json");
        assert_eq!(param(c(json!({"guided_choice": []})).unwrap_err()), "guided_choice");
        assert_eq!(
            param(c(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).unwrap_err()),
            "structured_outputs"
        );
        assert_eq!(param(c(json!({"structured_outputs": {"ebnf": "x"}})).unwrap_err()), "structured_outputs.ebnf");
        assert_eq!(
            param(c(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})).unwrap_err()),
            "guided_regex"
        );
        assert_eq!(
            param(c(json!({"guided_decoding_backend": "xgrammar", "guided_regex": "a"})).unwrap_err()),
            "guided_decoding_backend"
        );
    }
}
