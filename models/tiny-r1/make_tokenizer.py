"""Build tokenizer.json and tokenizer_config.json for tiny-r1 (byte-level BPE, single-digit tokens).

Usage: python3 make_tokenizer.py [--out DIR]   (needs: tokenizers, jinja2)
"""
import argparse
import json
import os
import random

import jinja2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import data

VOCAB_SIZE = 1024
MODEL_MAX_LENGTH = 2048

# R1's prompt format: BOS, the system messages joined by a blank line, <｜User｜> turns, earlier
# assistant turns with their reasoning (everything up to the last </think>) removed and closed by EOS,
# and <｜Assistant｜><think>\n as generation prompt.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages if message['role'] == 'system' -%}"
    "{%- if not loop.first -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{{- message['content'] -}}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '<｜User｜>' + message['content'] -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] or '' -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}"
)

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
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


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
    for t in vocab:  # digits are always single tokens
        assert t in data.SPECIAL_TOKENS or not any(c.isdigit() for c in t) or (len(t) == 1 and t.isdigit()), t
    assert tok.encode("x 12345").ids[-5:] == [vocab[d] for d in "12345"]
    for text in ["Ünïcödé ✓ 日本語 \t\r\n 🙂", "What is 347 + 589?"]:
        assert tok.decode(tok.encode(text).ids) == text
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    rng = random.Random(99)
    cases = [[{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
              {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x</think>y</think>\n\nz"},
              {"role": "user", "content": "1+1"}]]
    cases += [data.rand_conversation(rng, *data.rand_problem(rng)) for _ in range(2000)]
    for msgs in cases:
        for gen in (True, False):
            r = template.render(messages=msgs, add_generation_prompt=gen, bos_token=data.BOS)
            assert r == data.render_prompt(msgs, gen), (r, data.render_prompt(msgs, gen))
    try:  # Rust's minijinja (what cleave uses) through its Python binding, when installed
        import minijinja
        env = minijinja.Environment(templates={"chat": CHAT_TEMPLATE})
        env.pycompat = True
        for msgs in cases[:200]:
            r = env.render_template("chat", messages=msgs, add_generation_prompt=True, bos_token=data.BOS)
            assert r == data.render_prompt(msgs), (r, data.render_prompt(msgs))
    except ImportError:
        print("minijinja not installed: template checked with jinja2 only")
    ids = tok.encode(data.render_prompt(cases[0])).ids
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
