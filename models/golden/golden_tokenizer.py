"""The golden fixtures' tokenizer: a small byte-level BPE with DeepSeek-R1's special tokens,
tokenizer_config.json with R1's chat template, and chat.json. Test tooling only; see make_golden.py."""
import json
import os

from golden_config import log

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK = "<think>"
END_THINK = "</think>"

# DeepSeek-R1's chat template, trimmed to the parts our tokenizer has tokens for (no tool calls):
# BOS, all system messages joined by a blank line, <｜User｜> + text, prior assistant turns with
# everything up to the last </think> removed and closed by EOS, and a generation prompt that opens
# the reasoning: <｜Assistant｜><think>\n.
CHAT_TEMPLATE = (
    r"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    r"{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
    r"{%- for message in messages %}{%- if message['role'] == 'system' %}"
    r"{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    r"{% set ns.is_first_sp = false %}"
    r"{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}"
    r"{%- endif %}{%- endfor %}"
    r"{{ bos_token }}{{ ns.system_prompt }}"
    r"{%- for message in messages %}"
    r"{%- if message['role'] == 'user' %}{{'" + USER + r"' + message['content']}}{%- endif %}"
    r"{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    r"{% set content = message['content'] %}"
    r"{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    r"{{'" + ASSISTANT + r"' + content + '" + EOS + r"'}}"
    r"{%- endif %}"
    r"{%- endfor -%}"
    r"{% if add_generation_prompt %}{{'" + ASSISTANT + r"<think>\n'}}{% endif %}"
)

CORPUS = """
The quick brown fox jumps over the lazy dog. A small model can still learn the shape of words.
When the sun rises over the hills, the farmers walk to the fields and the children go to school.
Numbers such as 1, 2, 3, 10, 42 and 2025 appear in text, and so do dates like May 5th.
Reasoning is the process of thinking about something in a logical way to reach a conclusion.
First, we read the question. Then we think step by step. Finally, we write the answer.
Large language models predict the next token given all of the previous tokens in the context.
The attention layer lets every position look at the positions before it and mix their values.
A mixture of experts sends each token to a few experts, chosen by a router with learned weights.
Rotary position embeddings rotate pairs of channels by an angle that grows with the position.
She said that the weather would be fine tomorrow, but he was not sure and took an umbrella.
In the morning there was coffee and bread; in the evening there was soup, rice and vegetables.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
Please explain why the sky is blue. The sky looks blue because air scatters blue light the most.
The server reads a request, runs the model, and streams the tokens back to the client one by one.
Good tests compare the output of a new program with the output of a trusted reference program.
If the numbers do not match, look at each layer in turn until the first difference appears.
There are many ways to write a sentence, and there are many sentences that mean the same thing.
The library was quiet, and the only sound was the turning of pages and the ticking of a clock.
They walked along the river, talked about the past, and planned a journey to the mountains.
Water boils at one hundred degrees, and ice melts when the temperature rises above zero.
""".strip().splitlines()


def build_tokenizer(vocab_target=380):
    """Byte-level BPE. ids 0/1 = BOS/EOS (special); User/Assistant/think tokens appended at the end,
    as in the R1 tokenizer (not special, so they survive skip_special_tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(BOS, special=True, normalized=False),
                        AddedToken(EOS, special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    n_bpe = tok.get_vocab_size()
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (USER, ASSISTANT, THINK, END_THINK)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1, "BOS/EOS ids"
    return tok, n_bpe


def write_tokenizer(tok, d):
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


CHAT_EXAMPLES = [
    {"messages": [{"role": "user", "content": "Hello there, how are you?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "system", "content": "Answer in English."},
                  {"role": "user", "content": "What is two plus two?"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello!"},
                  {"role": "user", "content": "Tell me a story about the river."}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "add_generation_prompt": False},
]


def write_chat_golden(d, tok):
    """chat.json: template renderings (jinja2 and HF apply_chat_template) and their token ids
    (tokenized without adding special tokens: the rendered text already holds BOS)."""
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as HF renders chat templates
    tmpl = env.from_string(CHAT_TEMPLATE)
    hf_tok = None
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(d)
    except Exception as e:  # noqa: BLE001
        log(f"  [chat] AutoTokenizer failed: {e!r}")
    out = []
    for ex in CHAT_EXAMPLES:
        text = tmpl.render(messages=ex["messages"], add_generation_prompt=ex["add_generation_prompt"],
                           bos_token=BOS, eos_token=EOS)
        ids = tok.encode(text, add_special_tokens=False).ids
        rec = {**ex, "text": text, "ids": ids}
        if hf_tok is not None:
            try:
                hf_text = hf_tok.apply_chat_template(ex["messages"], tokenize=False,
                                                     add_generation_prompt=ex["add_generation_prompt"])
                hf_ids = hf_tok(hf_text, add_special_tokens=False)["input_ids"]
                if hf_text != text or list(hf_ids) != ids:
                    log(f"  [chat] MISMATCH jinja2 vs HF: {text!r} vs {hf_text!r}")
                rec["hf_agrees"] = hf_text == text and list(hf_ids) == ids
            except Exception as e:  # noqa: BLE001
                log(f"  [chat] apply_chat_template failed: {e!r}")
        out.append(rec)
    # plain-text encodings with and without the BOS the post-processor adds
    plain = "The quick brown fox jumps over the lazy dog."
    extra = {"text": plain,
             "ids_add_special": tok.encode(plain, add_special_tokens=True).ids,
             "ids_no_special": tok.encode(plain, add_special_tokens=False).ids}
    with open(os.path.join(d, "chat.json"), "w", encoding="utf-8") as f:
        json.dump({"chat": out, "encode": extra}, f, indent=1, ensure_ascii=False)
        f.write("\n")
