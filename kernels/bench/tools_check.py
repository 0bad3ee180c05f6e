#!/usr/bin/env python3
"""Tool calling against a running `cleave serve` of tiny-r1 (standard library only, for machines
without the openai client): the model's own calculator call, the answer to the tool's result, and a
named call of a tool it never saw whose arguments must fit the schema (sampled).

    python3 kernels/bench/tools_check.py http://127.0.0.1:8000
"""
import json
import sys
import urllib.request

URL = sys.argv[1].rstrip("/") + "/v1/chat/completions"
CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


def chat(body):
    req = urllib.request.Request(URL, json.dumps({"model": "tiny-r1", "max_tokens": 300, **body}).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]


q = [{"role": "user", "content": "What is 347 + 589?"}]
c = chat({"messages": q, "tools": [WEATHER, CALC], "temperature": 0})
call = c["message"]["tool_calls"][0]
assert c["finish_reason"] == "tool_calls" and call["function"]["name"] == "calculator", c
assert json.loads(call["function"]["arguments"]) == {"expression": "347 + 589"}, c
r = chat({"messages": q + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": "936"}], "tools": [CALC],
          "temperature": 0})
assert r["message"]["content"] == "347 + 589 = 936", r
for seed in range(4):
    n = chat({"messages": [{"role": "user", "content": f"What is {seed} + 5?"}], "tools": [CALC, WEATHER],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "temperature": 0.8, "seed": seed})
    a = json.loads(n["message"]["tool_calls"][0]["function"]["arguments"])
    assert set(a) == {"city", "unit"} and a["unit"] in ("celsius", "fahrenheit"), n
print(f"tools OK: auto {call['function']['arguments']}, answer {r['message']['content']!r}, named {a}")
