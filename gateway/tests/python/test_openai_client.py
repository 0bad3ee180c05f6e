#!/usr/bin/env python3
"""cleave serve through the official `openai` Python client, and through an SSE parser that reads
the stream exactly as `vllm bench serve` does.

Against a running server:   CLEAVE_URL=http://127.0.0.1:8000 python3 test_openai_client.py
Otherwise it starts `cleave serve --port 0` (binary from CLEAVE_BIN, default
target/release/cleave) with the default deployment (tiny-r1 on the CPU) and stops it at the end.
The cargo test `reasoning.rs` runs this file against an in-process server.

Prints "ALL OK" when every check passes; exits non-zero otherwise.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from openai import OpenAI

REPO = Path(__file__).resolve().parents[3]
QUESTION = "What is 347 + 589?"
ANSWER = "936"


def start_server():
    binary = os.environ.get("CLEAVE_BIN", str(REPO / "target" / "release" / "cleave"))
    proc = subprocess.Popen([binary, "serve", "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"cleave serve exited with {proc.wait()}")
        m = re.search(r"ready at (http://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("cleave serve did not get ready in 120 s")


def check_openai_client(url):
    client = OpenAI(base_url=url + "/v1", api_key=os.environ.get("CLEAVE_API_KEY", "unused"))
    model = client.models.list().data[0]
    assert model.owned_by == "cleave", model
    assert model.model_extra.get("root"), "vllm bench serve reads data[0].root"
    assert model.model_extra.get("max_model_len", 0) > 0
    messages = [{"role": "user", "content": QUESTION}]

    stream = client.chat.completions.create(
        model=model.id, messages=messages, stream=True, stream_options={"include_usage": True},
        temperature=0, max_tokens=300)
    reasoning, content, finish, usage, ids, chunks = "", "", None, None, set(), 0
    for chunk in stream:
        ids.add(chunk.id)
        if not chunk.choices:
            assert chunk.usage is not None, "the only choice-less chunk is the usage chunk"
            usage = chunk.usage
            continue
        assert usage is None, "usage comes last"
        chunks += 1
        choice = chunk.choices[0]
        delta = choice.delta
        if chunks == 1:
            assert delta.role == "assistant" and delta.content == "", delta
        extra = delta.model_extra or {}
        reasoning += extra.get("reasoning_content") or ""
        content += delta.content or ""
        if choice.finish_reason:
            finish = choice.finish_reason
    assert len(ids) == 1, f"one id for all chunks: {ids}"
    assert reasoning.strip(), "reasoning_content deltas came before </think>"
    assert "think>" not in reasoning + content, "the </think> token itself is never sent"
    assert ANSWER in content, f"content after </think> holds the answer: {content!r}"
    assert finish == "stop", finish
    assert usage is not None and usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    full = client.chat.completions.create(model=model.id, messages=messages, temperature=0, max_tokens=300)
    msg = full.choices[0].message
    assert msg.content == content, (msg.content, content)
    assert (msg.model_extra or {}).get("reasoning_content") == reasoning
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens == usage.completion_tokens

    short = client.chat.completions.create(model=model.id, messages=messages, temperature=0, max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.choices[0].message.content is None, "no </think> yet: content is null"

    text = "".join(c.choices[0].text for c in client.completions.create(
        model=model.id, prompt="12 + 30 =", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert isinstance(text, str)

    try:
        client.chat.completions.create(model=model.id, messages=messages, temperature=-1)
        raise AssertionError("temperature -1 must be refused")
    except Exception as e:  # openai.BadRequestError
        assert getattr(e, "status_code", None) == 400, e
    # Prefix caching: the same long system prompt twice; the second answer reports the prompt
    # tokens served from the cache (whole 64-token blocks) in usage.prompt_tokens_details.
    system = {"role": "system", "content": "Answer with the sum only. " * 40}
    cached = []
    for q in ("What is 2 + 3?", "What is 7 + 8?"):
        r = client.chat.completions.create(
            model=model.id, messages=[system, {"role": "user", "content": q}], temperature=0, max_tokens=4)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    assert cached[1] >= 64 and cached[1] < r.usage.prompt_tokens, (cached, r.usage)

    # Structured outputs: the client's own parse() sends a strict json_schema built from a
    # pydantic model and parses the answer back into it (sampled, so not by luck).
    from pydantic import BaseModel

    class Sum(BaseModel):
        answer: int
        sure: bool

    for seed in range(2):
        r = client.chat.completions.parse(
            model=model.id, messages=[{"role": "user", "content": f"What is {40 + seed} + 12?"}],
            response_format=Sum, temperature=0.7, seed=seed, max_tokens=400)
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, Sum), r
        assert (r.choices[0].message.model_extra or {}).get("reasoning_content"), "the reasoning stays free"

    print(f"openai client: reasoning {len(reasoning)} chars, content {content.strip()!r}, "
          f"{usage.completion_tokens} completion tokens, {chunks} chunks, cached tokens {cached}, parsed {parsed}")


def check_tools(client, model):
    """Tool calling as an agent framework drives it: the model's own call (auto), the streamed call
    reassembled by the client's stream helper, the turn with the tool's result, and a named strict
    pydantic tool whose arguments the client parses back (sampled)."""
    from typing import Literal

    import openai
    from pydantic import BaseModel

    calc = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    question = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=model, messages=question, tools=[calc], temperature=0, max_tokens=300)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", r
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "calculator", r
    assert json.loads(call.function.arguments) == {"expression": "347 + 589"}, call

    with client.chat.completions.stream(model=model, messages=question, tools=[calc], temperature=0,
                                        max_tokens=300) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert len(streamed) == 1 and streamed[0].function.arguments == call.function.arguments, final

    followup = question + [choice.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
                           {"role": "tool", "tool_call_id": call.id, "content": ANSWER}]
    r = client.chat.completions.create(model=model, messages=followup, tools=[calc], temperature=0, max_tokens=50)
    assert r.choices[0].message.content == "347 + 589 = 936" and r.choices[0].finish_reason == "stop", r

    class GetWeather(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    for seed in range(2):
        r = client.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": f"What is {seed} + 3?"}],
            tools=[openai.pydantic_function_tool(GetWeather)], temperature=0.7, seed=seed, max_tokens=300,
            tool_choice={"type": "function", "function": {"name": "GetWeather"}})
        parsed = r.choices[0].message.tool_calls[0].function.parsed_arguments
        assert isinstance(parsed, GetWeather), r
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], tools=[calc],
                                       tool_choice="required", temperature=0.7, seed=1, max_tokens=300)
    assert r.choices[0].message.tool_calls, r
    print(f"tools: auto call {call.function.arguments}, answer after the result, parsed {parsed}")


def check_sampling_controls(client, model, url):
    """Presence and frequency penalties and logit bias as the client sends them (the bias keyed by
    token ids as strings, OpenAI's form)."""
    seven = json.loads(urllib_post(url + "/tokenize", {"prompt": "7", "add_special_tokens": False}))["tokens"]
    assert len(seven) == 1, seven
    r = client.completions.create(model=model, prompt="12 + 30 =", max_tokens=3, temperature=0,
                                  logit_bias={str(seven[0]): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == "777", r
    # (What the penalties do to each pick is checked in the engine's tests against the model's
    # own logprobs; tiny-r1 answers this question the same with them.)
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=60, presence_penalty=1.5, frequency_penalty=1.0)
    assert r.usage.completion_tokens > 0 and r.choices[0].finish_reason in ("stop", "length"), r
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1, presence_penalty=3)
        raise AssertionError("presence_penalty 3 must be refused")
    except Exception as e:  # openai.BadRequestError
        assert getattr(e, "status_code", None) == 400, e
    print(f"sampling controls: logit_bias forced '777'; penalties accepted ({r.usage.completion_tokens} tokens)")


def check_prompt_lists(client, model):
    """Several prompts in one completions request (lm-eval-harness sends batches so): choice
    p n + j is prompt p's choice j, each as that prompt alone gives it."""
    prompts = ["12 + 30 =", "7 + 8 ="]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0).choices[0].text
             for p in prompts]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3], r
    assert [c.text for c in r.choices] == [alone[0], alone[0], alone[1], alone[1]], (r, alone)
    print(f"prompt lists: {len(r.choices)} choices for {len(prompts)} prompts, {r.usage.prompt_tokens} prompt tokens")


def auth_headers():
    """What vllm bench serve sends when OPENAI_API_KEY is set (here: the server's key, if any)."""
    key = os.environ.get("CLEAVE_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def vllm_bench_style(url):
    """POST a streaming chat and parse it like vllm bench serve's async_request_openai_chat_completions."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    payload = {"model": "", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0.0,
               "max_completion_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
               "ignore_eos": True}
    models = json.loads(urllib_get(url + "/v1/models"))
    payload["model"] = models["data"][0]["id"]
    st = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(payload),
                 {"Content-Type": "application/json", **auth_headers()})
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    ttft, itl, generated, output_tokens, most_recent, buf = 0.0, [], "", None, st, b""
    while True:
        data = resp.read1(65536)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            raw, buf = buf.split(b"\n\n", 1)
            chunk = raw.strip().decode("utf-8").removeprefix("data: ")
            if not chunk or chunk == "[DONE]":
                continue
            obj = json.loads(chunk)
            if choices := obj.get("choices"):
                delta = choices[0]["delta"]
                ts = time.perf_counter()
                if ttft == 0.0:
                    ttft = ts - st
                else:
                    itl.append(ts - most_recent)
                most_recent = ts
                generated += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            elif usage := obj.get("usage"):
                output_tokens = usage.get("completion_tokens")
    assert buf.strip() == b"", f"trailing bytes: {buf!r}"
    assert ttft > 0 and output_tokens == 64, (ttft, output_tokens)
    assert len(itl) >= 32, f"one chunk per token or so: {len(itl)}"
    print(f"vllm-bench-style parse: ttft {ttft * 1000:.1f} ms, {len(itl) + 1} chunks, {output_tokens} tokens")


def urllib_post(url, body):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", u.path, json.dumps(body), {"Content-Type": "application/json", **auth_headers()})
    return conn.getresponse().read()


def urllib_get(url):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", u.path, headers=auth_headers())
    return conn.getresponse().read()


def main():
    url = os.environ.get("CLEAVE_URL")
    proc = None
    if not url:
        proc, url = start_server()
    try:
        check_openai_client(url)
        vllm_bench_style(url)
        client = OpenAI(base_url=url + "/v1", api_key=os.environ.get("CLEAVE_API_KEY", "none"))
        check_tools(client, client.models.list().data[0].id)
        check_sampling_controls(client, client.models.list().data[0].id, url)
        check_prompt_lists(client, client.models.list().data[0].id)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    print("ALL OK")


if __name__ == "__main__":
    sys.exit(main())
