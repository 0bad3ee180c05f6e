//! Tests over a small byte-level BPE tokenizer with DeepSeek's special tokens, written to a
//! temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::{ChatMessage, ChatOptions, IncrementalDecoder, Tokenizer};
use crate::error::EngineError;

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";

/// DeepSeek-R1's prompt format (REFERENCE.md section 2), plus a `thinking` kwarg that closes
/// the reasoning section when it is false.
const R1_TEMPLATE: &str = r#"{% set ns = namespace(system='', first=true) %}
{% for m in messages %}
{% if m['role'] == 'system' %}
{% if ns.first %}{% set ns.system = m['content'] %}{% set ns.first = false %}{% else %}{% set ns.system = ns.system + '\n\n' + m['content'] %}{% endif %}
{% endif %}
{% endfor %}
{{ bos_token }}{{ ns.system -}}
{% for m in messages %}
{% if m['role'] == 'user' %}
{{ '<｜User｜>' + m['content'] -}}
{% elif m['role'] == 'assistant' %}
{% set content = m['content'] %}
{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' -}}
{% elif m['role'] != 'system' %}
{{ raise_exception('Unsupported role: ' + m['role']) }}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
{% if thinking is defined and not thinking %}{{ '<｜Assistant｜></think>' }}{% else %}{{ '<｜Assistant｜><think>\n' }}{% endif %}
{% endif %}"#;

/// GPT-2's byte-to-character table used by byte-level BPE.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// Writes `tokenizer.json` (and `tokenizer_config.json` with `template` when given) into a
/// fresh temporary directory.
fn write_tokenizer(name: &str, template: Option<&str>) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "cleave-tokenizer-{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();

    let added = [(BOS, true), (EOS, true), (USER, true), (ASSISTANT, true), ("<think>", false), ("</think>", false)];
    let mut vocab = serde_json::Map::new();
    let mut added_tokens = Vec::new();
    for (id, (content, special)) in added.iter().enumerate() {
        vocab.insert(content.to_string(), json!(id));
        added_tokens.push(json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special}));
    }
    for c in byte_chars() {
        let id = vocab.len();
        vocab.insert(c.to_string(), json!(id));
    }
    // A few merges so that some tokens span several characters; "é" (bytes C3 A9) is one token,
    // CJK characters and emoji stay split into byte tokens.
    let merges = ["h e", "l l", "l o", "Ã ©", "Ġ w", "o r"];
    for m in merges {
        let id = vocab.len();
        vocab.insert(m.replace(' ', ""), json!(id));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    if let Some(template) = template {
        let config = json!({
            "add_bos_token": true,
            "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": false, "normalized": true,
                          "rstrip": false, "single_word": false},
            "eos_token": EOS,
            "chat_template": template,
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }
    dir
}

fn load(name: &str, template: Option<&str>) -> (Tokenizer, PathBuf) {
    let dir = write_tokenizer(name, template);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    (tok, dir)
}

fn cleanup(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        msg("system", "You are helpful."),
        msg("system", "Be brief."),
        msg("user", "Hi"),
        ChatMessage {
            reasoning_content: Some("The user greets me.".into()),
            ..msg("assistant", "<think>\nThe user greets me.\n</think>\n\nHello!")
        },
        msg("user", "What is 2+2?"),
    ]
}

#[test]
fn tokenizer_loads_config_and_special_tokens() {
    let (tok, dir) = load("config", Some(R1_TEMPLATE));
    assert_eq!(tok.bos_token(), Some(BOS));
    assert_eq!(tok.eos_token(), Some(EOS));
    assert!(tok.has_chat_template());
    assert_eq!(tok.token_to_id(BOS), Some(0));
    assert_eq!(tok.token_to_id(EOS), Some(1));
    assert_eq!(tok.id_to_token(1).as_deref(), Some(EOS));
    assert!(tok.is_special(0) && tok.is_special(1) && tok.is_special(2) && tok.is_special(3));
    assert!(!tok.is_special(4) && !tok.is_special(5) && !tok.is_special(10));
    assert_eq!(tok.vocab_size(), 6 + 256 + 6);
    // Plain encode adds BOS through the post-processor; without special tokens it does not.
    assert_eq!(tok.encode("hello", true).unwrap()[0], 0);
    assert_ne!(tok.encode("hello", false).unwrap()[0], 0);
    assert_eq!(tok.decode(&tok.encode("hello world", true).unwrap(), true).unwrap(), "hello world");
    cleanup(&dir);
}

#[test]
fn tokenizer_chat_template_renders_r1_conversation() {
    let (tok, dir) = load("render", Some(R1_TEMPLATE));
    let text = tok.apply_chat_template(&conversation(), ChatOptions::generation()).unwrap();
    let expected = format!(
        "{BOS}You are helpful.\n\nBe brief.{USER}Hi{ASSISTANT}\n\nHello!{EOS}{USER}What is 2+2?{ASSISTANT}<think>\n"
    );
    assert_eq!(text, expected);
    // Without the generation prompt the text ends after the last user turn.
    let text = tok.apply_chat_template(&conversation(), ChatOptions::default()).unwrap();
    assert!(text.ends_with(&format!("{USER}What is 2+2?")), "{text:?}");
    // Request kwargs reach the template.
    let kwargs = json!({"thinking": false});
    let text = tok
        .apply_chat_template(
            &conversation()[2..3],
            ChatOptions { add_generation_prompt: true, kwargs: Some(&kwargs), ..ChatOptions::default() },
        )
        .unwrap();
    assert_eq!(text, format!("{BOS}{USER}Hi{ASSISTANT}</think>"));
    // Kwargs that are not an object are the request's fault.
    let err = tok
        .apply_chat_template(
            &conversation(),
            ChatOptions { add_generation_prompt: true, kwargs: Some(&json!([1])), ..ChatOptions::default() },
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
    cleanup(&dir);
}

#[test]
fn tokenizer_encode_chat_has_exactly_one_bos() {
    let (tok, dir) = load("bos", Some(R1_TEMPLATE));
    let ids = tok.encode_chat(&conversation(), ChatOptions::generation()).unwrap();
    assert_eq!(ids[0], 0);
    assert_eq!(ids.iter().filter(|&&id| id == 0).count(), 1);
    // Role markers are single tokens; the prompt ends with `<｜Assistant｜><think>\n`.
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    let n = ids.len();
    assert_eq!(&ids[n - 3..n - 1], &[3, 4]);
    assert_eq!(tok.decode(&ids[n - 1..], false).unwrap(), "\n");
    let text = tok.apply_chat_template(&conversation(), ChatOptions::generation()).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    cleanup(&dir);
}

#[test]
fn tokenizer_think_end_is_one_token() {
    let (tok, dir) = load("think", Some(R1_TEMPLATE));
    assert_eq!(tok.think_end_id(), Some(5));
    let ids = tok.encode("ab</think>cd", false).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 5).count(), 1);
    assert_eq!(ids.len(), 5);
    // `</think>` is not special: it survives skip_special_tokens.
    assert_eq!(tok.decode(&ids, true).unwrap(), "ab</think>cd");
    cleanup(&dir);
}

/// Pushes `ids` one by one, checking each chunk, and returns the chunks (finish included).
fn stream(tok: &Tokenizer, mut dec: IncrementalDecoder, ids: &[u32]) -> Vec<String> {
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
    chunks.push(dec.finish(tok).unwrap());
    for c in &chunks {
        assert!(!c.contains('\u{FFFD}'), "chunk {c:?} holds U+FFFD");
    }
    assert_eq!(dec.text(), chunks.concat());
    chunks
}

#[test]
fn tokenizer_incremental_decoder_never_splits_characters() {
    let (tok, dir) = load("detok", None);
    let text = "héllo 世界 🙂 world!";
    let ids = tok.encode(text, false).unwrap();
    // The emoji and CJK characters really are split into byte tokens.
    let partial = ids.iter().filter(|&&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}')).count();
    assert!(partial >= 10, "only {partial} partial tokens");
    let chunks = stream(&tok, IncrementalDecoder::new(false), &ids);
    assert_eq!(chunks.concat(), tok.decode(&ids, false).unwrap());
    assert_eq!(chunks.concat(), text);
    // The 4 bytes of the emoji come out as one chunk.
    assert!(chunks.iter().any(|c| c.contains('🙂')));

    // Seeded with prompt context, only the generated text is emitted.
    let prompt = tok.encode("Say hello", true).unwrap();
    let chunks = stream(&tok, IncrementalDecoder::with_prompt(&prompt, false), &ids);
    assert_eq!(chunks.concat(), text);

    // A sequence that ends inside a character: held back by push, released by finish.
    let emoji = tok.encode("a🙂", false).unwrap();
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.push(&tok, emoji[0]).unwrap(), "a");
    assert_eq!(dec.push(&tok, emoji[1]).unwrap(), "");
    assert_eq!(dec.push(&tok, emoji[2]).unwrap(), "");
    let tail = dec.finish(&tok).unwrap();
    assert_eq!(format!("a{tail}"), tok.decode(&emoji[..3], false).unwrap());
    cleanup(&dir);
}

#[test]
fn tokenizer_skip_special_tokens_drops_eos() {
    let (tok, dir) = load("skip", Some(R1_TEMPLATE));
    let mut ids = tok.encode("hello world", false).unwrap();
    ids.push(1);
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world");
    assert_eq!(tok.decode(&ids, false).unwrap(), format!("hello world{EOS}"));
    let chunks = stream(&tok, IncrementalDecoder::new(true), &ids);
    assert_eq!(chunks.concat(), "hello world");
    assert_eq!(chunks[chunks.len() - 2], "", "EOS must produce no text");
    let chunks = stream(&tok, IncrementalDecoder::new(false), &ids);
    assert_eq!(chunks.concat(), format!("hello world{EOS}"));
    cleanup(&dir);
}

#[test]
fn tokenizer_template_raise_exception_is_an_error() {
    let (tok, dir) = load("raise", Some(R1_TEMPLATE));
    let err = tok.apply_chat_template(&[msg("robot", "beep")], ChatOptions::generation()).unwrap_err();
    assert!(matches!(err, EngineError::Tokenizer(_)));
    assert!(err.to_string().contains("Unsupported role: robot"), "{err}");
    cleanup(&dir);
}

#[test]
fn tokenizer_template_python_methods_and_tojson() {
    let template = "{{ messages[0].content.strip().split(',')[1] }}|{{ messages[0].content.startswith('  a') }}|{{ tools | tojson }}|{{ missing.x }}";
    let (tok, dir) = load("pycompat", Some(template));
    let kwargs = json!({"tools": [{"name": "f<x>", "parameters": {"b": 1, "a": [true, null, 1.5]}}]});
    let text = tok.apply_chat_template(
        &[msg("user", "  a,b,c  ")],
        ChatOptions { add_generation_prompt: false, kwargs: Some(&kwargs), ..ChatOptions::default() },
    );
    // Undefined attribute access on an undefined value is an error naming the line.
    let err = text.unwrap_err().to_string();
    assert!(err.contains("undefined") && err.contains("chat_template:1"), "{err}");

    let template = "{{ messages[0].content.strip().split(',')[1] }}|{{ messages[0].content.startswith('  a') }}|{{ tools | tojson }}";
    let (tok2, dir2) = load("pycompat2", Some(template));
    let text = tok2
        .apply_chat_template(
            &[msg("user", "  a,b,c  ")],
            ChatOptions { add_generation_prompt: false, kwargs: Some(&kwargs), ..ChatOptions::default() },
        )
        .unwrap();
    // Booleans print like Python; objects keep the order they came in (serde_json's
    // preserve_order, which llguidance turns on) and tojson writes like transformers' json.dumps
    // (spaced, keys unsorted, no HTML escaping).
    assert_eq!(text, r#"b|True|[{"name": "f<x>", "parameters": {"b": 1, "a": [true, null, 1.5]}}]"#);
    cleanup(&dir);
    cleanup(&dir2);
}

#[test]
fn tokenizer_missing_files_and_templates() {
    let dir = std::env::temp_dir().join(format!("cleave-tokenizer-missing-{}", std::process::id()));
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    let path = dir.join("tokenizer.json");
    assert!(matches!(&err, EngineError::Io { path: p, .. } if *p == path), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");

    // No tokenizer_config.json: the tokenizer works but has no template.
    let (tok, dir) = load("notemplate", None);
    assert!(!tok.has_chat_template());
    assert_eq!(tok.bos_token(), None);
    let err = tok.apply_chat_template(&[msg("user", "hi")], ChatOptions::generation()).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    cleanup(&dir);

    // A template that does not compile names the file.
    let dir = write_tokenizer("badtemplate", Some("{% for %}"));
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json") && err.to_string().contains("syntax error"), "{err}");
    cleanup(&dir);
}

#[test]
fn tokenizer_config_template_list_prefers_default() {
    let dir = write_tokenizer("list", None);
    let config = json!({
        "bos_token": null,
        "eos_token": {"content": EOS},
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ eos_token }}{{ messages | length }}"},
        ],
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.bos_token(), None);
    assert_eq!(tok.eos_token(), Some(EOS));
    let text = tok.apply_chat_template(&[msg("user", "a"), msg("user", "b")], ChatOptions::default()).unwrap();
    assert_eq!(text, format!("{EOS}2"));
    cleanup(&dir);
}
