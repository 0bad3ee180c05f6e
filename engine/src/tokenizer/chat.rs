//! Chat messages and the minijinja environment that renders Hugging Face chat templates.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectExt, Value, ValueKind};
use minijinja::{Environment, ErrorKind};

use crate::error::{EngineError, Result};

/// Name under which the chat template is compiled (it appears in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// One message of a chat conversation, as the OpenAI API sends it (content already flattened
/// to a string).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text of the message. An assistant turn with tool calls and no text is rendered with
    /// `content` none, as OpenAI clients send it.
    pub content: String,
    /// Reasoning of a prior assistant turn; passed to the template as `reasoning_content`,
    /// which DeepSeek's templates ignore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls of an assistant turn; the template sees `tool_calls` only when there are some.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with text only.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), ..ChatMessage::default() }
    }
}

/// A function call of an assistant turn, rendered as OpenAI's `{id, type: "function",
/// function: {name, arguments}}` with `arguments` the JSON text the model wrote.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What a chat template is rendered with besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatOptions<'a> {
    /// End the prompt where the assistant's answer starts.
    pub add_generation_prompt: bool,
    /// The request's tool definitions (OpenAI's `tools` list), the template's `tools`.
    pub tools: Option<&'a [serde_json::Value]>,
    /// `chat_template_kwargs`: a JSON object merged into the template's context.
    pub kwargs: Option<&'a serde_json::Value>,
}

impl<'a> ChatOptions<'a> {
    /// The options of a prompt that asks for the assistant's answer.
    pub fn generation() -> Self {
        ChatOptions { add_generation_prompt: true, ..ChatOptions::default() }
    }
}

/// A compiled chat template with its environment.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source` in an environment configured like transformers' Jinja environment.
    pub(crate) fn new(source: String) -> std::result::Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_syntax(minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)?;
        Ok(ChatTemplate { env })
    }

    /// Renders the template for `messages`; see [`super::Tokenizer::apply_chat_template`].
    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        opts: ChatOptions<'_>,
        bos: Option<&str>,
        eos: Option<&str>,
    ) -> Result<String> {
        let mut ctx = OrderedMap::default();
        // Like transformers: a token the config does not name is undefined (renders empty).
        if let Some(bos) = bos {
            ctx.insert("bos_token", Value::from(bos));
        }
        if let Some(eos) = eos {
            ctx.insert("eos_token", Value::from(eos));
        }
        match opts.kwargs {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(map)) => {
                for (key, value) in map {
                    ctx.insert(key, json_to_value(value));
                }
            }
            Some(other) => {
                return Err(EngineError::InvalidRequest(format!(
                    "chat_template_kwargs must be a JSON object, got {}",
                    json_kind(other)
                )))
            }
        }
        let messages: Vec<Value> = messages.iter().map(message_to_value).collect();
        ctx.insert("messages", Value::from(messages));
        ctx.insert("add_generation_prompt", Value::from(opts.add_generation_prompt));
        if let Some(tools) = opts.tools.filter(|t| !t.is_empty()) {
            ctx.insert("tools", Value::from(tools.iter().map(json_to_value).collect::<Vec<_>>()));
        }

        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| template_error(&e))?;
        template.render(Value::from_object(ctx)).map_err(|e| template_error(&e))
    }
}

/// `chat template: <kind>: <detail> (in chat_template:<line>)`, plus any underlying cause.
fn template_error(err: &minijinja::Error) -> EngineError {
    let mut msg = format!("chat template: {err}");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let _ = write!(msg, ": {cause}");
        source = cause.source();
    }
    EngineError::Tokenizer(msg)
}

/// `raise_exception(msg)`: templates call it to reject a conversation (transformers does the same).
fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn message_to_value(m: &ChatMessage) -> Value {
    let mut map = OrderedMap::default();
    map.insert("role", Value::from(m.role.as_str()));
    if m.content.is_empty() && !m.tool_calls.is_empty() {
        map.insert("content", Value::from(()));
    } else {
        map.insert("content", Value::from(m.content.as_str()));
    }
    if let Some(reasoning) = &m.reasoning_content {
        map.insert("reasoning_content", Value::from(reasoning.as_str()));
    }
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|c| {
            let mut function = OrderedMap::default();
            function.insert("name", Value::from(c.name.as_str()));
            function.insert("arguments", Value::from(c.arguments.as_str()));
            let mut call = OrderedMap::default();
            call.insert("id", Value::from(c.id.as_str()));
            call.insert("type", Value::from("function"));
            call.insert("function", Value::from_object(function));
            Value::from_object(call)
        });
        map.insert("tool_calls", Value::from(calls.collect::<Vec<_>>()));
    }
    if let Some(id) = &m.tool_call_id {
        map.insert("tool_call_id", Value::from(id.as_str()));
    }
    Value::from_object(map)
}

/// Converts JSON into template values, keeping the key order of objects (as Python dicts do).
fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => Value::from(items.iter().map(json_to_value).collect::<Vec<_>>()),
        serde_json::Value::Object(map) => {
            let mut out = OrderedMap::default();
            for (key, value) in map {
                out.insert(key, json_to_value(value));
            }
            Value::from_object(out)
        }
    }
}

/// A string-keyed map that iterates in insertion order (minijinja's own maps are sorted).
#[derive(Debug, Default)]
struct OrderedMap(Vec<(Arc<str>, Value)>);

impl OrderedMap {
    /// Inserts or replaces `key` (a replaced key keeps its position).
    fn insert(&mut self, key: &str, value: Value) {
        match self.0.iter_mut().find(|(k, _)| &**k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((Arc::from(key), value)),
        }
    }
}

impl Object for OrderedMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_key_value_enumerator(|this| {
            Box::new(this.0.iter().map(|(k, v)| (Value::from(k.clone()), v.clone())))
        })
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// transformers' `tojson` filter: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` (no HTML escaping, unlike minijinja's builtin). `indent`
/// may also be passed positionally, as with Jinja's builtin filter.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let a = seps.get_item_by_index(0)?;
            let b = seps.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let writer = PyJson { indent, item_sep, key_sep, ensure_ascii, sort_keys };
    let mut out = String::new();
    writer.write(&mut out, value, 0)?;
    Ok(Value::from_safe_string(out))
}

/// Writes values the way Python's `json.dumps` does.
struct PyJson {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn write(&self, out: &mut String, v: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        if depth > 256 {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.write_str(out, v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    let key = match key.as_str() {
                        Some(s) => s.to_string(),
                        None if key.is_none() => "null".to_string(),
                        None => key.to_string(),
                    };
                    pairs.push((key, item));
                }
                if self.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, '{', '}', &pairs, depth, |out, (k, item), depth| {
                    self.write_str(out, k);
                    out.push_str(&self.key_sep);
                    self.write(out, item, depth)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.write_container(out, '[', ']', &items, depth, |out, item, depth| self.write(out, item, depth))?;
            }
            _ => self.write_str(out, &v.to_string()),
        }
        Ok(())
    }

    fn write_container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[T],
        depth: usize,
        mut each: impl FnMut(&mut String, &T, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(out, depth + 1);
            each(out, item, depth + 1)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)` for the values JSON can hold (`1.0`, `0.1`, `1e+20`, `NaN`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else if f.abs() >= 1e16 || f.abs() < 1e-4 {
        let s = format!("{f:e}");
        // Rust writes `1e20` / `1.5e-7`; Python writes `1e+20` / `1.5e-07`.
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                format!("{mantissa}e{sign}{digits:0>2}")
            }
            None => s,
        }
    } else {
        format!("{f}")
    }
}
