"""Build tokenizer.json and tokenizer_config.json for tiny-r1 (byte-level BPE, single-digit tokens).

Usage: python3 make_tokenizer.py [--out DIR]   (needs: tokenizers, jinja2)
"""
import argparse
import json
import os
import random
import re

import jinja2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import data

VOCAB_SIZE = 1024
MODEL_MAX_LENGTH = 2048

# R1's prompt format: BOS, the system messages joined by a blank line (then, when the request has tools, the
# tools section of vLLM's DeepSeek-R1 tool template), <｜User｜> turns, earlier assistant turns with their
# reasoning (everything up to the last </think>) removed and closed by EOS, tool calls and tool results in
# R1's tool tokens, and <｜Assistant｜><think>\n as generation prompt (none right after tool results: the
# answer follows <｜tool▁outputs▁end｜>, as in R1's own template). data.render_prompt is its Python mirror.
TOOL_FORMAT = ("\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜>"
               "<｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\\n```json\\ntool_call_arguments\\n```"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(system='', outputs=false) -%}"
    "{%- for message in messages if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + ('\\n\\n' if not loop.first else '') + message['content'] -%}"
    "{%- endfor -%}"
    "{%- if tools -%}"
    "{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '')"
    " + '## Tools\\nYou have access to the following tools:\\n' -%}"
    "{%- for tool in tools -%}"
    "{%- set ns.system = ns.system + '\\n### ' + tool['function']['name'] + '\\nDescription: '"
    " + (tool['function']['description'] or '') + '\\n\\nParameters: '"
    " + ((tool['function']['parameters'] or {}) | tojson) + '\\n' -%}"
    "{%- endfor -%}"
    "{%- set ns.system = ns.system + '" + TOOL_FORMAT + "' -%}"
    "{%- endif -%}"
    "{{- ns.system -}}"
    "{%- for message in messages -%}"
    "{%- set after_outputs = ns.outputs and message['role'] != 'tool' -%}"
    "{%- if after_outputs -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- set ns.outputs = false -%}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '<｜User｜>' + message['content'] -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] or '' -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "{%- if message['tool_calls'] -%}"
    "{{- '<｜Assistant｜>' + content + '<｜tool▁calls▁begin｜>' -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<｜tool▁call▁begin｜>' + (call['type'] or 'function') + '<｜tool▁sep｜>' + call['function']['name']"
    " + '\\n```json\\n' + call['function']['arguments'] + '\\n```<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}"
    "{{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' -}}"
    "{%- else -%}"
    "{{- ('' if after_outputs else '<｜Assistant｜>') + content + '<｜end▁of▁sentence｜>' -}}"
    "{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- ('' if ns.outputs else '<｜tool▁outputs▁begin｜>') + '<｜tool▁output▁begin｜>' + message['content']"
    " + '<｜tool▁output▁end｜>' -}}"
    "{%- set ns.outputs = true -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.outputs -%}{{- '<｜tool▁outputs▁end｜>' -}}"
    "{%- elif add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}"
)
# One tag per line (every tag trims the whitespace around it, so the newlines render as nothing).
CHAT_TEMPLATE = re.sub(r"(-%}|-}})(?=\{[%{]-)", "\\1\n", CHAT_TEMPLATE)

ENGLISH = """The quick brown fox jumps over the lazy dog. Hello! How are you today? I am fine, thank you.
This is a small language model that can add and subtract numbers. It thinks step by step before it answers.
Please write a short story about a cat who lives in a library. Can you explain how a computer works?
What is the capital of France? Paris is the capital and the largest city of France.
Translate this sentence into German. Summarize the following text in one paragraph.
I don't know the answer, but I will try my best. Let's think about the problem carefully.
The weather is nice; we could go for a walk in the park, or stay at home and read a book.
Numbers, letters, punctuation (like commas, periods and quotes: "yes" or 'no') and symbols such as
@, #, $, %, &, *, /, \\, |, <, >, [, ], {, }, ~ and ^ may all appear in a user's message.
Write a function in Python that returns the sum of a list. def add(x, y): return x + y
Thank you very much for your help. You're welcome! Goodbye, and have a great day.
"""


def corpus():
    rng = random.Random(data.TOKENIZER_SEED)
    for i in range(30000):
        p = data.rand_problem(rng)
        yield data.render_prompt(data.rand_conversation(rng, *p)) + data.completion(*p)
        if i % 100 == 0:
            yield ENGLISH


def build():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # adds no BOS: the template holds it
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=data.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    # Like DeepSeek-R1: <think> and </think> are added tokens but not special ones.
    j = json.loads(tok.to_str())
    for t in j["added_tokens"]:
        t["special"] = t["content"] not in (data.THINK, data.END_THINK)
        t["normalized"] = False
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    # R1's tool-call tokens come after the trained vocabulary, so every other token keeps its id.
    tok.add_special_tokens(data.TOOL_TOKENS)
    return tok


def py_tojson(value, indent=None):
    """transformers' `tojson` filter (json.dumps, no HTML escaping, keys in order), which cleave mirrors."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def jinja_env():
    env = jinja2.Environment()
    env.filters["tojson"] = py_tojson
    return env


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": data.BOS,
        "eos_token": data.EOS,
        "pad_token": data.EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def check(tok):
    vocab = tok.get_vocab()
    for i, s in enumerate(data.SPECIAL_TOKENS):
        assert vocab[s] == i and tok.encode(s).ids == [i], s
    for i, s in enumerate(data.TOOL_TOKENS):
        assert vocab[s] == VOCAB_SIZE + i and tok.encode(s).ids == [VOCAB_SIZE + i], s
    for t in vocab:  # digits are always single tokens
        assert t in data.SPECIAL_TOKENS or not any(c.isdigit() for c in t) or (len(t) == 1 and t.isdigit()), t
    assert tok.encode("x 12345").ids[-5:] == [vocab[d] for d in "12345"]
    for text in ["Ünïcödé ✓ 日本語 \t\r\n 🙂", "What is 347 + 589?"]:
        assert tok.decode(tok.encode(text).ids) == text
    template = jinja_env().from_string(CHAT_TEMPLATE)
    rng = random.Random(99)
    two_calls = {"role": "assistant", "content": "<think>\nhm</think>\n\nLet me check.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "function": {"name": "g", "arguments": "{\"x\":1}"}}]}
    cases = [([{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
               {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x</think>y</think>\n\nz"},
               {"role": "user", "content": "1+1"}], None),
             ([{"role": "system", "content": "S"}, {"role": "user", "content": "q"}, two_calls,
               {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
               {"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}],
              [data.tool("f", None, {}), data.tool("g", "G.", {"x": "integer"})])]
    cases += [(data.rand_conversation(rng, *data.rand_problem(rng)), None) for _ in range(2000)]
    cases += [data.tool_example(rng, *data.rand_problem(rng))[:2] for _ in range(500)]
    for msgs, tools in cases:
        for gen in (True, False):
            r = template.render(messages=msgs, add_generation_prompt=gen, bos_token=data.BOS, tools=tools)
            assert r == data.render_prompt(msgs, gen, tools), (r, data.render_prompt(msgs, gen, tools))
    try:  # Rust's minijinja (what cleave uses) through its Python binding, when installed
        import minijinja
        env = minijinja.Environment(templates={"chat": CHAT_TEMPLATE})
        env.pycompat = True
        env.add_filter("tojson", py_tojson)
        for msgs, tools in cases[:200] + cases[-50:]:
            r = env.render_template("chat", messages=msgs, add_generation_prompt=True, bos_token=data.BOS,
                                    tools=tools)
            assert r == data.render_prompt(msgs, tools=tools), (r, data.render_prompt(msgs, tools=tools))
    except ImportError:
        print("minijinja not installed: template checked with jinja2 only")
    ids = tok.encode(data.render_prompt(cases[0][0])).ids
    assert ids.count(0) == 1 and ids[0] == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    tok = build()
    check(tok)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    ex = data.render_prompt([{"role": "user", "content": "What is 347 + 589?"}]) + data.completion(347, "+", 589)
    print("vocab", tok.get_vocab_size(), "example tokens", len(tok.encode(ex).ids))
    print([tok.id_to_token(i) for i in tok.encode(ex).ids])


if __name__ == "__main__":
    main()
