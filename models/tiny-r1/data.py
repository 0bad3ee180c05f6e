"""Problems, English phrasings and R1-style answers for tiny-r1.

Task: integer addition and subtraction, operands 0..9999, results may be negative.
Everything is derived from integer seeds (see README.md); run this file to print samples.
"""
import json
import random

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT, THINK, END_THINK]  # ids 0..5 in this order
# DeepSeek-V3/R1's tool-call tokens, appended after the 1024 BPE tokens (ids 1024..1032 in this order).
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, TOOL_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
OUTPUTS_BEGIN, OUTPUTS_END = "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
TOOL_TOKENS = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, TOOL_SEP, OUTPUTS_BEGIN, OUTPUTS_END, OUTPUT_BEGIN,
               OUTPUT_END]

EVAL_SEED = 1000       # the 1000 held-out evaluation problems
EVAL_SIZE = 1000
TOKENIZER_SEED = 7     # text the tokenizer is trained on
TRAIN_SEED = 1234      # training stream (train.py adds the worker index)
TOOL_EVAL_SEED = 2000  # tool lists of the held-out tool-call evaluation
TOOL_SHARE = 0.3       # share of training examples that use a tool (half calls, half answers to a result)

# ---------------------------------------------------------------- problems

def rand_operand(rng):
    """Length 1..4 uniformly, then a value of that length; sometimes 0/9-heavy digits (long carry chains)."""
    n = rng.randint(1, 4)
    if rng.random() < 0.2:
        ds = [rng.choice("09" + str(rng.randint(0, 9))) for _ in range(n)]
        if n > 1 and ds[0] == "0":
            ds[0] = rng.choice("19")
        return int("".join(ds))
    return rng.randint(0 if n == 1 else 10 ** (n - 1), 10 ** n - 1)


def rand_problem(rng):
    return rand_operand(rng), rng.choice("+-"), rand_operand(rng)


def result(a, op, b):
    return a + b if op == "+" else a - b

# ---------------------------------------------------------------- phrasings
# {E} is the expression (e.g. "347 + 589"); {a} and {b} are the operands of a OP b.

GENERIC = [
    "What is {E}?", "What is {E}", "what's {E}", "What's {E}?", "Compute {E}.", "Calculate {E}.",
    "Evaluate {E}.", "{E}", "{E} = ?", "{E}=?", "{E} =", "How much is {E}?", "Please compute {E}.",
    "Can you calculate {E}?", "Could you work out {E}?", "Solve {E}.", "Solve: {E}", "Find {E}.",
    "Tell me {E}.", "What does {E} equal?", "What is the value of {E}?", "I need {E}.",
    "Quick question: what is {E}?", "Work out {E}.", "Give me the result of {E}.", "{E} is what?",
    "Hey, what's {E}?", "What do you get for {E}?", "Compute: {E}", "what is {E} equal to?",
    "Do the math: {E}", "Please calculate {E} for me.", "Answer this: {E}", "{E}?",
    "Can you tell me what {E} is?", "What is the answer to {E}?", "Result of {E}?",
]
ADD = [
    "What is the sum of {a} and {b}?", "Add {a} and {b}.", "Add {b} to {a}.", "Sum {a} and {b}.",
    "What is {a} increased by {b}?", "What do you get if you add {a} and {b}?",
    "What is the total of {a} and {b}?", "Find the sum of {a} and {b}.", "{a} plus {b} equals what?",
    "If you add {b} to {a}, what do you get?", "Calculate {a} plus {b}.", "What is {a} plus {b}?",
]
SUB = [
    "Subtract {b} from {a}.", "What is {b} subtracted from {a}?", "What is {a} decreased by {b}?",
    "What is {a} take away {b}?", "Take {b} away from {a}.", "What is the difference between {a} and {b}?",
    "If you subtract {b} from {a}, what do you get?", "What is {a} less {b}?", "{a} minus {b} equals what?",
    "Compute {a} minus {b}.", "What is {a} minus {b}?", "How much is {a} take away {b}?",
]
OP_WORDS = {"+": ["+", "+", "+", "plus"], "-": ["-", "-", "-", "minus"]}


def expression(rng, a, op, b):
    w = rng.choice(OP_WORDS[op])
    if w in "+-":
        return rng.choice(["{a} {w} {b}"] * 4 + ["{a}{w}{b}"] * 3 + ["{a} {w}{b}", "{a}{w} {b}"]).format(a=a, w=w, b=b)
    return f"{a} {w} {b}"


def phrase(rng, a, op, b):
    if rng.random() < 0.7:
        text = rng.choice(GENERIC).format(E=expression(rng, a, op, b))
    else:
        text = rng.choice(ADD if op == "+" else SUB).format(a=a, b=b)
    r = rng.random()
    if r < 0.15:
        text = text.lower()
    elif r < 0.22:
        text = text.upper()
    elif r < 0.27:
        text = text[:1].lower() + text[1:]
    r = rng.random()
    if r < 0.12:
        text = text.rstrip("?.!=: ")
    elif r < 0.17:
        text = text.rstrip("?.!") + rng.choice(["!", "??", " ?", "?!", "..."])
    if rng.random() < 0.04:
        text = rng.choice([" ", "\n", "  "]) + text + rng.choice([" ", "\n", ""])
    return text

# ---------------------------------------------------------------- chain of thought


def _columns(top, bottom, op):
    """Column-by-column work on two 4-digit strings, right to left; returns lines and the digit string."""
    lines, digits, c = [], "", 0
    for i in range(3, -1, -1):
        x, y = int(top[i]), int(bottom[i])
        if op == "+":
            s = x + y + c
            lines.append(f"{x} + {y} + {c} = {s}, digit {s % 10}, carry {s // 10}")
            digits, c = str(s % 10) + digits, s // 10
        else:
            d = x - y - c
            if d < 0:
                lines.append(f"{x} - {y} - {c} < 0, {x + 10} - {y} - {c} = {d + 10}, digit {d + 10}, borrow 1")
                digits, c = str(d + 10) + digits, 1
            else:
                lines.append(f"{x} - {y} - {c} = {d}, digit {d}, borrow 0")
                digits, c = str(d) + digits, 0
    if op == "+" and c:
        digits = "1" + digits
    return lines, digits


def reasoning(a, op, b):
    """The text between <think>\\n and </think>."""
    A, B = f"{a:04d}", f"{b:04d}"
    lines = [f"{a} {op} {b}", f"{A} {op} {B}"]
    if op == "+":
        cols, digits = _columns(A, B, "+")
        lines += cols + [f"digits {digits}, so {a} + {b} = {a + b}"]
        return "\n".join(lines) + "\n"
    steps = []
    for x, y in zip(A, B):
        steps.append(f"{x} {'=' if x == y else '<' if x < y else '>'} {y}")
        if x != y:
            break
    rel = "=" if a == b else "<" if a < b else ">"
    lines.append(f"compare: {', '.join(steps)}, so {a} {rel} {b}")
    if a >= b:
        cols, digits = _columns(A, B, "-")
        lines += cols + [f"digits {digits}, so {a} - {b} = {a - b}"]
    else:
        cols, digits = _columns(B, A, "-")
        lines += [f"negative: compute {b} - {a}, then negate", f"{B} - {A}"] + cols
        lines += [f"digits {digits}, so {b} - {a} = {b - a}", f"then {a} - {b} = {a - b}"]
    return "\n".join(lines) + "\n"


def answer(a, op, b):
    return f"{a} {op} {b} = {result(a, op, b)}"


def completion(a, op, b):
    """Everything the model writes after the prompt (which ends with <think>\\n), EOS included."""
    return reasoning(a, op, b) + END_THINK + "\n\n" + answer(a, op, b) + EOS

# ---------------------------------------------------------------- chat format


def tools_text(tools):
    """The tools section the chat template appends to the system prompt (vLLM's DeepSeek-R1 tool template)."""
    out = "## Tools\nYou have access to the following tools:\n"
    for t in tools:
        f = t["function"]
        params = json.dumps(f.get("parameters") or {}, ensure_ascii=False)
        out += f"\n### {f['name']}\nDescription: {f.get('description') or ''}\n\nParameters: {params}\n"
    return out + ("\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n" + CALLS_BEGIN + CALL_BEGIN
                  + "function" + TOOL_SEP + "tool_call_name\n```json\ntool_call_arguments\n```" + CALL_END
                  + CALLS_END)


def call_text(call):
    """One tool call as the model writes it (R1's format)."""
    f = call["function"]
    return CALL_BEGIN + (call.get("type") or "function") + TOOL_SEP + f["name"] + "\n```json\n" + f["arguments"] + "\n```" + CALL_END


def render_prompt(messages, add_generation_prompt=True, tools=None):
    """Python mirror of the chat template in tokenizer_config.json (checked equal by make_tokenizer.py).

    R1's format: BOS, the system prompt (then the tools section), user turns, earlier answers after their
    last </think> closed by EOS, tool calls in R1's tokens, tool results between the tool-output tokens;
    the generation prompt opens the reasoning, except right after tool results, where the answer follows."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    if tools:
        system += ("\n\n" if system else "") + tools_text(tools)
    out, in_outputs = BOS + system, False
    for m in messages:
        after_outputs = in_outputs and m["role"] != "tool"
        if after_outputs:
            out, in_outputs = out + OUTPUTS_END, False
        content = (m.get("content") or "").split(END_THINK)[-1] if m["role"] == "assistant" else m.get("content")
        if m["role"] == "user":
            out += USER + content
        elif m["role"] == "assistant" and m.get("tool_calls"):
            out += ASSISTANT + content + CALLS_BEGIN + "\n".join(call_text(c) for c in m["tool_calls"])
            out += CALLS_END + EOS
        elif m["role"] == "assistant":
            out += ("" if after_outputs else ASSISTANT) + content + EOS
        elif m["role"] == "tool":
            out += ("" if in_outputs else OUTPUTS_BEGIN) + OUTPUT_BEGIN + content + OUTPUT_END
            in_outputs = True
    if in_outputs:
        return out + OUTPUTS_END
    return out + (ASSISTANT + THINK + "\n" if add_generation_prompt else "")


SYSTEMS = [
    "You are a helpful assistant.", "You are a careful calculator. Show your work.",
    "You are tiny-r1, a small model that does arithmetic.", "Answer the user's question.",
    "You are a math tutor.", "Be concise.",
]


def rand_conversation(rng, a, op, b):
    """Messages ending with a user turn asking a OP b: mostly one user turn, sometimes a system prompt
    and/or an earlier exchange (as a client would send it, reasoning included or not)."""
    msgs = []
    if rng.random() < 0.1:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    if rng.random() < 0.05:
        p = rand_problem(rng)
        prior = completion(*p)[: -len(EOS)]
        msgs += [{"role": "user", "content": phrase(rng, *p)},
                 {"role": "assistant", "content": prior if rng.random() < 0.5 else prior.split(END_THINK)[-1].strip()}]
    msgs.append({"role": "user", "content": phrase(rng, a, op, b)})
    return msgs

# ---------------------------------------------------------------- tools

CALC_NAMES = ["calculator", "calc", "compute", "math", "arithmetic", "evaluate", "add_or_subtract"]
CALC_DESCS = ["Evaluate an arithmetic expression.", "Adds or subtracts two integers.",
              "A calculator for + and -.", "Computes the value of an expression like 3 + 4.", ""]
OTHER_TOOLS = [
    ("get_weather", "Get the current weather in a city.", {"city": "string"}),
    ("search", "Search the web.", {"query": "string"}),
    ("send_email", "Send an email.", {"to": "string", "body": "string"}),
    ("get_time", "Current time in a time zone.", {"timezone": "string"}),
    ("lookup", "Look up a word in the dictionary.", {"word": "string"}),
]


def tool(name, desc, params):
    props = {k: {"type": v} for k, v in params.items()}
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(params)}}}


def rand_tools(rng):
    """A calculator tool (name and description vary) and, a third of the time, an unrelated tool beside it."""
    calc = tool(rng.choice(CALC_NAMES), rng.choice(CALC_DESCS), {"expression": "string"})
    calc["function"]["parameters"]["properties"]["expression"]["description"] = rng.choice(
        ["", "e.g. 12 + 30", "The expression to evaluate."])
    if not calc["function"]["parameters"]["properties"]["expression"]["description"]:
        del calc["function"]["parameters"]["properties"]["expression"]["description"]
    if rng.random() < 1 / 3:
        other = tool(*rng.choice(OTHER_TOOLS))
        return [calc, other] if rng.random() < 0.5 else [other, calc]
    return [calc]


def calc_call(tools, a, op, b):
    """The call the model makes: the calculator tool with the problem's expression (compact JSON)."""
    name = next(t["function"]["name"] for t in tools if "expression" in t["function"]["parameters"]["properties"])
    args = json.dumps({"expression": f"{a} {op} {b}"}, separators=(",", ":"))
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}


def tool_call_completion(tools, a, op, b):
    """With tools: restate, decide, close the reasoning, call the calculator, EOS."""
    call = calc_call(tools, a, op, b)
    think = f"{a} {op} {b}\ncall {call['function']['name']}\n"
    return think + END_THINK + "\n\n" + CALLS_BEGIN + call_text(call) + CALLS_END + EOS


def tool_result_messages(rng, tools, a, op, b):
    """A conversation that ends with the calculator's result for a OP b."""
    msgs = rand_conversation(rng, a, op, b)
    return msgs + [{"role": "assistant", "content": None, "tool_calls": [calc_call(tools, a, op, b)]},
                   {"role": "tool", "tool_call_id": "call_0", "content": str(result(a, op, b))}]


def tool_example(rng, a, op, b):
    """(messages, tools, completion) of a tool-using example: a call half the time, else the answer to a result."""
    tools = rand_tools(rng)
    if rng.random() < 0.5:
        return rand_conversation(rng, a, op, b), tools, tool_call_completion(tools, a, op, b)
    return tool_result_messages(rng, tools, a, op, b), tools, answer(a, op, b) + EOS


# ---------------------------------------------------------------- splits


def eval_set():
    """The 1000 held-out problems: list of dicts with a, op, b, the user message and the answer."""
    rng, seen, out = random.Random(EVAL_SEED), set(), []
    while len(out) < EVAL_SIZE:
        p = rand_problem(rng)
        if p in seen:
            continue
        seen.add(p)
        out.append({"a": p[0], "op": p[1], "b": p[2], "user": phrase(rng, *p), "answer": answer(*p)})
    return out


def held_out_problems():
    return {(e["a"], e["op"], e["b"]) for e in eval_set()}


def train_examples(seed):
    """Endless stream of (prompt_text, completion_text) for training; never a held-out problem."""
    rng, held = random.Random(seed), held_out_problems()
    while True:
        p = rand_problem(rng)
        if p in held:
            continue
        if rng.random() < TOOL_SHARE:
            msgs, tools, comp = tool_example(rng, *p)
            yield render_prompt(msgs, tools=tools), comp
        else:
            yield render_prompt(rand_conversation(rng, *p)), completion(*p)


def tool_eval_set(n=200):
    """Held-out problems with tools: (problem, tools, expected call completion, result messages)."""
    rng = random.Random(TOOL_EVAL_SEED)
    out = []
    for e in eval_set()[:n]:
        p = (e["a"], e["op"], e["b"])
        tools = rand_tools(rng)
        msgs = [{"role": "user", "content": e["user"]}]
        out.append({**e, "tools": tools, "messages": msgs, "call": tool_call_completion(tools, *p),
                    "result_messages": msgs + tool_result_messages(rng, tools, *p)[-2:]})
    return out


# Fixed problems whose HF greedy outputs are recorded in expected_answers.json for cleave's tests.
FIXED_PROMPTS = [
    "What is 347 + 589?", "Compute 1200 - 457.", "what's 38+4", "Calculate 12 plus 7.",
    "What is 15 minus 2300?", "9999 + 9999", "What is 1000 - 1?", "SUBTRACT 58 FROM 3004.",
    "What is 0 + 0?", "what is 5 - 5", "Add 4721 to 5279.", "What is the difference between 12 and 9876?",
    "How much is 4096 - 4097?", "Evaluate 7+8.", "What is the sum of 1234 and 8766?", "63-7=?",
    "Please compute 2024 minus 999.", "Take 250 away from 100.", "WHAT IS 8 PLUS 3?", "Find 5005 - 4996.",
]

if __name__ == "__main__":
    rng = random.Random(0)
    for _ in range(6):
        p = rand_problem(rng)
        print(repr(render_prompt(rand_conversation(rng, *p)) + completion(*p)), "\n")
    print(reasoning(15, "-", 2300) + END_THINK + "\n\n" + answer(15, "-", 2300))
