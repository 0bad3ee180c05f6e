//! Chat `messages` as OpenAI clients send them, read into the engine's [`ChatMessage`]s: text or
//! text parts, assistant `tool_calls`, and `tool` results with their `tool_call_id`.

use cleave_engine::tokenizer::{ChatMessage, ToolCall};
use serde_json::Value;

use crate::errors::{kind, ApiError};

/// Reads `messages`: a non-empty list of `{role, content}` where content is a string, a list of
/// `{type: "text", text}` parts, or null. `reasoning_content` on assistant turns is accepted and
/// ignored; `developer` is treated as `system`.
pub fn messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "`messages` must not be empty")),
        None | Some(Value::Null) => return Err(ApiError::field("messages", "`messages` is required")),
        Some(other) => {
            return Err(ApiError::field("messages", format!("`messages` must be a list, got {}", kind(other))))
        }
    };
    list.iter().enumerate().map(|(i, m)| message(i, m)).collect()
}

fn message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let at = |k: &str| format!("messages[{i}].{k}");
    let obj = m
        .as_object()
        .ok_or_else(|| ApiError::field(format!("messages[{i}]"), format!("`messages[{i}]` must be an object")))?;
    let role = match obj.get("role") {
        Some(Value::String(r)) => r.as_str(),
        None => return Err(ApiError::field(at("role"), format!("`{}` is required", at("role")))),
        Some(v) => {
            return Err(ApiError::field(at("role"), format!("`{}` must be a string, got {}", at("role"), kind(v))))
        }
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        "developer" => "system",
        other => return Err(ApiError::field(at("role"), format!("unknown role `{other}` in `{}`", at("role")))),
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => {
            return Err(ApiError::field(at("content"), format!("`{}` is required", at("content"))))
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let p = format!("messages[{i}].content[{j}]");
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::field(format!("{p}.text"), format!("`{p}.text` must be a string")))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::field(
                            format!("{p}.type"),
                            format!("content parts of type `{other}` are not supported"),
                        ))
                    }
                    (None, _) => return Err(ApiError::field(format!("{p}.type"), format!("`{p}.type` is required"))),
                }
            }
            text
        }
        Some(v) => {
            return Err(ApiError::field(
                at("content"),
                format!("`{}` must be a string or a list of parts, got {}", at("content"), kind(v)),
            ))
        }
    };
    let tool_calls = match (role, obj.get("tool_calls")) {
        (_, None | Some(Value::Null)) => Vec::new(),
        ("assistant", Some(Value::Array(calls))) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(&format!("messages[{i}].tool_calls[{j}]"), c))
            .collect::<Result<_, _>>()?,
        ("assistant", Some(v)) => {
            return Err(ApiError::field(
                at("tool_calls"),
                format!("`{}` must be a list, got {}", at("tool_calls"), kind(v)),
            ))
        }
        (_, Some(_)) => {
            return Err(ApiError::field(
                at("tool_calls"),
                format!("`{}` is only allowed on assistant messages", at("tool_calls")),
            ))
        }
    };
    let tool_call_id = match obj.get("tool_call_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::field(
                at("tool_call_id"),
                format!("`{}` must be a string, got {}", at("tool_call_id"), kind(v)),
            ))
        }
    };
    Ok(ChatMessage { role: role.to_string(), content, reasoning_content: None, tool_calls, tool_call_id })
}

/// One `tool_calls` entry of an assistant message: `{id, type: "function", function: {name,
/// arguments}}`; `arguments` is the JSON text (an object is accepted and written compactly).
fn tool_call(at: &str, c: &Value) -> Result<ToolCall, ApiError> {
    let field = |k: &str| format!("{at}.{k}");
    let o = c.as_object().ok_or_else(|| ApiError::field(at, format!("`{at}` must be an object")))?;
    if o.get("type").is_some_and(|t| !t.is_null() && t.as_str() != Some("function")) {
        return Err(ApiError::field(field("type"), format!("`{}` must be \"function\"", field("type"))));
    }
    let id = match o.get("id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::field(field("id"), format!("`{}` must be a string", field("id")))),
    };
    let f = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::field(field("function"), format!("`{}` must be an object", field("function"))))?;
    let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::field(field("function.name"), format!("`{}` must be a non-empty string", field("function.name")))
    })?;
    let arguments = match f.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Object(_)) => v.to_string(),
        None | Some(Value::Null) => "{}".to_string(),
        Some(v) => {
            return Err(ApiError::field(
                field("function.arguments"),
                format!("`{}` must be a JSON string, got {}", field("function.arguments"), kind(v)),
            ))
        }
    };
    Ok(ToolCall { id, name: name.to_string(), arguments })
}
