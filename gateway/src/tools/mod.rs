//! Tool calling: the request's `tools`, `tool_choice` and `parallel_tool_calls`, the grammar that
//! enforces `required` and a named function in DeepSeek's own tool-call format, and the parser
//! ([`parser`]) that turns the model's tool-call tokens into OpenAI `tool_calls`.
//!
//! As in vLLM: `auto` lets the model choose and parses what it writes; `required` and a named
//! function constrain the answer (after `</think>` for a reasoning prompt) to calls whose
//! arguments fit the function's `parameters` schema; `none` renders no tools and parses nothing
//! (vLLM's `--exclude-tools-when-tool-choice-none`).

pub mod parser;

use cleave_engine::structured;
use serde_json::{json, Map, Value};

use crate::errors::ApiError;
pub use parser::{ToolCallDelta, ToolCallParser, ToolTokens};

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`.
    Function(String),
}

/// A request's tools, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The `tools` list as sent (each `{type: "function", function: {name, description?, parameters?}}`).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false allows one call per answer.
    pub parallel: bool,
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tool(i: usize, v: &Value) -> Result<String, ApiError> {
    let at = |k: &str| format!("tools[{i}]{k}");
    let o = v.as_object().ok_or_else(|| ApiError::field(at(""), format!("`{}` must be an object", at(""))))?;
    match o.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(t) => return Err(ApiError::field(at(".type"), format!("tools of type `{t}` are not supported"))),
        None => return Err(ApiError::field(at(".type"), format!("`{}` must be \"function\"", at(".type")))),
    }
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::field(at(".function"), format!("`{}` must be an object", at(".function"))))?;
    let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
    if !valid_name(name) {
        return Err(ApiError::field(
            at(".function.name"),
            format!("`{}` must be 1 to 64 letters, digits, `_` or `-`", at(".function.name")),
        ));
    }
    if f.get("description").is_some_and(|d| !d.is_null() && !d.is_string()) {
        let p = at(".function.description");
        return Err(ApiError::field(&p, format!("`{p}` must be a string")));
    }
    if f.get("parameters").is_some_and(|p| !p.is_null() && !p.is_object()) {
        let p = at(".function.parameters");
        return Err(ApiError::field(&p, format!("`{p}` must be a JSON schema object")));
    }
    Ok(name.to_string())
}

fn choice(v: Option<&Value>, names: &[String]) -> Result<ToolChoice, ApiError> {
    let p = "tool_choice";
    match v {
        None | Some(Value::Null) => Ok(if names.is_empty() { ToolChoice::None } else { ToolChoice::Auto }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::field(
                p,
                format!("`tool_choice` must be none, auto, required or a function, got {other:?}"),
            )),
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) if names.iter().any(|t| t == n) => Ok(ToolChoice::Function(n.to_string())),
                (Some("function"), Some(n)) => {
                    Err(ApiError::field("tool_choice.function.name", format!("no tool named `{n}` in `tools`")))
                }
                _ => Err(ApiError::field(
                    p,
                    "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )),
            }
        }
        Some(_) => Err(ApiError::field(p, "`tool_choice` must be a string or an object")),
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when the request uses no tools.
pub fn request(body: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(ApiError::field("tools", "`tools` must be a list")),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let name = tool(i, t)?;
        if names.contains(&name) {
            return Err(ApiError::field(format!("tools[{i}].function.name"), format!("two tools are named `{name}`")));
        }
        names.push(name);
    }
    let choice = choice(body.get("tool_choice"), &names)?;
    if names.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::field("tool_choice", "`tool_choice` needs `tools`"));
    }
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::field("parallel_tool_calls", "`parallel_tool_calls` must be a boolean")),
    };
    Ok((!names.is_empty()).then_some(ToolRequest { tools, choice, parallel }))
}

impl ToolRequest {
    /// The tools the chat template renders (none for `tool_choice: none`).
    pub fn rendered(&self) -> Option<&[Value]> {
        (self.choice != ToolChoice::None).then_some(self.tools.as_slice())
    }

    /// Whether the answer is parsed for calls.
    pub fn parses(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Calls one answer may hold.
    pub fn max_calls(&self) -> usize {
        if self.parallel && !matches!(self.choice, ToolChoice::Function(_)) {
            usize::MAX
        } else {
            1
        }
    }

    /// The Lark grammar of a `required` or named choice: optional whitespace, then calls in R1's
    /// format whose arguments follow each function's `parameters` (compact JSON), nothing after.
    pub fn grammar(&self, t: &ToolTokens) -> Option<String> {
        let only = match &self.choice {
            ToolChoice::Required => None,
            ToolChoice::Function(n) => Some(n.as_str()),
            ToolChoice::None | ToolChoice::Auto => return None,
        };
        let mut rules = Vec::new();
        let mut alternatives = Vec::new();
        for (i, tool) in self.tools.iter().enumerate() {
            let f = &tool["function"];
            let name = f["name"].as_str().unwrap_or_default();
            if only.is_some_and(|o| o != name) {
                continue;
            }
            let schema = structured::compact(match f.get("parameters") {
                Some(p) if p.is_object() => p.clone(),
                _ => json!({"type": "object"}),
            });
            let head = Value::String(format!("{name}\n```json\n"));
            rules.push(format!(
                "call_{i}: <[{}]> \"function\" <[{}]> {head} %json {schema} \"\\n```\" <[{}]>",
                t.call_begin, t.sep, t.call_end
            ));
            alternatives.push(format!("call_{i}"));
        }
        let calls = if self.max_calls() == 1 { "call" } else { "call (\"\\n\"? call)*" };
        Some(format!(
            "start: /[ \\n]*/ <[{}]> {calls} <[{}]>\ncall: {}\n{}\n",
            t.calls_begin,
            t.calls_end,
            alternatives.join(" | "),
            rules.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(e: ApiError) -> String {
        match e {
            ApiError::InvalidField { param, .. } => param,
            other => panic!("not a field error: {other:?}"),
        }
    }

    fn req(v: Value) -> Result<Option<ToolRequest>, ApiError> {
        request(v.as_object().unwrap())
    }

    #[test]
    fn tools_and_choices_are_validated_naming_the_field() {
        let f = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
        assert_eq!(req(json!({})).unwrap(), None);
        assert_eq!(req(json!({"tool_choice": "none"})).unwrap(), None);
        assert_eq!(param(req(json!({"tool_choice": "auto"})).unwrap_err()), "tool_choice");
        let r = req(json!({"tools": [f("a"), f("b")]})).unwrap().unwrap();
        assert_eq!((r.choice.clone(), r.max_calls()), (ToolChoice::Auto, usize::MAX));
        let r = req(json!({"tools": [f("a")], "tool_choice": {"type": "function", "function": {"name": "a"}}}));
        assert_eq!(r.unwrap().unwrap().max_calls(), 1);
        let r = req(json!({"tools": [f("a")], "tool_choice": "required", "parallel_tool_calls": false}));
        assert_eq!(r.unwrap().unwrap().max_calls(), 1);
        let bad = [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "code_interpreter"}]}), "tools[0].type"),
            (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools[0].function.name"),
            (json!({"tools": [f("a"), f("a")]}), "tools[1].function.name"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tools": [f("a")], "tool_choice": "always"}), "tool_choice"),
            (
                json!({"tools": [f("a")], "tool_choice": {"type": "function", "function": {"name": "b"}}}),
                "tool_choice.function.name",
            ),
            (json!({"tools": [f("a")], "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        ];
        for (body, p) in bad {
            assert_eq!(param(req(body.clone()).unwrap_err()), p, "{body}");
        }
        let none = req(json!({"tools": [f("a")], "tool_choice": "none"})).unwrap().unwrap();
        assert!(none.rendered().is_none() && !none.parses());
    }

    #[test]
    fn the_grammar_names_the_chosen_functions_with_their_schemas() {
        let t = ToolTokens::for_tests();
        let tools = json!([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
                           {"type": "function", "function": {"name": "b"}}]);
        let r = req(json!({"tools": tools, "tool_choice": "required"})).unwrap().unwrap();
        let g = r.grammar(&t).unwrap();
        assert!(g.contains("call: call_0 | call_1"), "{g}");
        assert!(g.contains("\"a\\n```json\\n\" %json {\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"x-guidance\""), "{g}");
        assert!(g.contains("(\"\\n\"? call)*"), "{g}");
        let r = req(json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "b"}}}))
            .unwrap()
            .unwrap();
        let g = r.grammar(&t).unwrap();
        assert!(g.contains("call: call_1\n") && !g.contains("call_0"), "{g}");
        assert!(!g.contains("(\"\\n\"? call)*"), "one call");
        let r = req(json!({"tools": tools})).unwrap().unwrap();
        assert!(r.grammar(&t).is_none(), "auto is not constrained");
    }
}
