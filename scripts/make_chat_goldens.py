#!/usr/bin/env python3
"""Render the chat-encoding golden files with DeepSeek's own Python encoders.

Usage: make_chat_goldens.py ENCODER_DIR [OUT_DIR]

ENCODER_DIR holds encoding_dsv32.py (DeepSeek-V3.2 release, encoding/encoding_dsv32.py) and
encoding_dsv4.py (DeepSeek-V4 release, encoding/encoding_dsv4.py). They are not part of this
repository; the renderings they produce are (tests/data/text/chat/*.json), and the C++ encoder
must reproduce each one byte for byte.

A golden file holds one OpenAI-style request and its renderings for both formats with thinking
off and on. The request is turned into the encoder's message list exactly as dsa.cpp does it:
  - request-level "tools" go onto a leading system/developer message, or onto a new empty system
    message put in front when the conversation has none;
  - a content given as a list of {"type": "text"} parts becomes their texts joined by a blank line;
  - "thinking" (true/false or {"type": "enabled"|"disabled"}) picks the thinking mode,
    "chat_template_kwargs": {"drop_thinking": false} keeps earlier reasoning, and
    "reasoning_effort": "high"|"max" is passed through to the V4 encoder.
A combination the official encoder refuses (it raises) is left out of the file and listed here.
"""
import copy
import importlib.util
import json
import os
import sys

S = {"role": "system", "content": "You are a helpful assistant."}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SHELL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1},
                "env": {"type": "object"},
            },
            "required": ["command"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Sök på webben — 検索 🔎",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "number"}},
        },
    },
}


def call(cid, name, args):
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


CONVERSATIONS = [
    ("plain", {"messages": [{"role": "user", "content": "Hello"}]}),
    ("system", {"messages": [S, {"role": "user", "content": "What is 2 + 2?"}]}),
    ("multi_turn", {"messages": [
        S,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]}),
    ("drop_thinking", {"messages": [
        S,
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": "First answer.", "reasoning_content": "First reasoning."},
        {"role": "user", "content": "Two"},
        {"role": "assistant", "content": "Second answer.", "reasoning_content": "Second reasoning."},
        {"role": "user", "content": "Three"},
    ]}),
    ("keep_thinking", {"chat_template_kwargs": {"drop_thinking": False}, "messages": [
        S,
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": "First answer.", "reasoning_content": "First reasoning."},
        {"role": "user", "content": "Two"},
    ]}),
    ("tools_with_system", {"tools": [WEATHER, SHELL], "messages": [
        S, {"role": "user", "content": "What's the weather in Paris?"},
    ]}),
    ("tools_without_system", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
    ]}),
    ("tool_call_and_result", {"tools": [WEATHER], "messages": [
        S,
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
         "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18, \"sky\": \"clear\"}"},
    ]}),
    ("parallel_tool_calls", {"tools": [WEATHER, SHELL], "messages": [
        S,
        {"role": "user", "content": "Weather in Paris, Rome and Tokyo, then list /tmp."},
        {"role": "assistant", "content": "Checking all three.", "reasoning_content": "Three calls.",
         "tool_calls": [
             call("call_a", "get_weather", {"city": "Paris"}),
             call("call_b", "get_weather", {"city": "Rome", "unit": "fahrenheit"}),
             call("call_c", "bash", {"command": "ls -la /tmp", "timeout": 30,
                                     "env": {"LANG": "C", "DEBUG": True, "PATH": None}}),
         ]},
        {"role": "tool", "tool_call_id": "call_b", "content": "Rome: 75F"},
        {"role": "tool", "tool_call_id": "call_a", "content": "Paris: 18C"},
        {"role": "tool", "tool_call_id": "call_c", "content": "total 0"},
        {"role": "assistant", "content": "Paris 18C, Rome 75F; /tmp is empty.",
         "reasoning_content": "Summarize."},
        {"role": "user", "content": "Thanks!"},
    ]}),
    ("agent_loop", {"tools": [SHELL], "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the TODOs in src/."},
        {"role": "assistant", "content": "", "reasoning_content": "grep first.",
         "tool_calls": [call("t1", "bash", {"command": "grep -rn TODO src/ | head -n 5"})]},
        {"role": "tool", "tool_call_id": "t1", "content": "src/a.cpp:3: // TODO: \"fix\" </b>\n"},
        {"role": "assistant", "content": "One more look.", "reasoning_content": "Open the file.",
         "tool_calls": [call("t2", "bash", {"command": "sed -n '1,5p' src/a.cpp", "timeout": 5})]},
        {"role": "tool", "tool_call_id": "t2", "content": "int main() {}\n"},
    ]}),
    ("unicode", {"tools": [SEARCH], "messages": [
        {"role": "system", "content": "Réponds en français. 你好 🌍"},
        {"role": "user", "content": "東京の天気は？ 👨‍👩‍👧 مرحبا \u00e9\u0301 tab\there"},
        {"role": "assistant", "content": "検索します。",
         "tool_calls": [call("u1", "search", {"query": "東京 天気 ☀️", "top_k": 3.5})]},
        {"role": "tool", "tool_call_id": "u1", "content": "晴れ、25°C"},
        {"role": "assistant", "content": "東京は晴れ、25°Cです。"},
        {"role": "user", "content": "Merci ! ✨"},
    ]}),
    ("developer", {"tools": [WEATHER], "messages": [
        {"role": "developer", "content": "Answer tersely."},
    ]}),
    ("empty_arguments", {"tools": [WEATHER], "messages": [
        S,
        {"role": "user", "content": "Call it with nothing."},
        {"role": "assistant", "content": None, "reasoning_content": "No arguments needed.",
         "tool_calls": [call("e1", "get_weather", "{}")]},
        {"role": "tool", "tool_call_id": "e1", "content": ""},
    ]}),
    ("argument_values", {"tools": [SHELL], "messages": [
        S,
        {"role": "user", "content": "Write the file."},
        {"role": "assistant", "content": "Writing it now.", "reasoning_content": "Heredoc.",
         "tool_calls": [call("v1", "bash", (
             '{"command":"cat > x.html <<\'EOF\'\\n<p class=\\"a\\">\\\\n</p>\\n</div>\\nEOF",'
             '"timeout":1.0E-5,"env":{"A":[1,2.50,-0,1E21,123456789.125,1e16,0.0001],'
             '"B":"x\\u0001y\\u00e9","C":{}}}'))]},
        {"role": "tool", "tool_call_id": "v1", "content": "ok"},
    ]}),
    ("response_format", {"messages": [
        {"role": "system", "content": "Extract data.",
         "response_format": {"type": "json_schema", "json_schema": {
             "name": "person", "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}}},
        {"role": "user", "content": "Ada Lovelace, born 1815."},
    ]}),
    ("content_parts", {"messages": [
        S,
        {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                     {"type": "text", "text": "Part two."}]},
    ]}),
    ("consecutive_users", {"messages": [
        S, {"role": "user", "content": "One"}, {"role": "user", "content": "Two"},
    ]}),
    ("continue_after_tools", {"tools": [WEATHER], "messages": [
        S,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call.",
         "tool_calls": [call("c1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "assistant", "content": "It is 18C in Paris.", "reasoning_content": "Report."},
        {"role": "user", "content": "And tomorrow?"},
    ]}),
    ("reasoning_effort_max", {"reasoning_effort": "max", "messages": [
        S, {"role": "user", "content": "Prove it."},
    ]}),
    ("latest_reminder", {"messages": [
        S, {"role": "latest_reminder", "content": "2026-08-11, London"},
        {"role": "user", "content": "Hello"},
    ]}),
    ("task_action", {"messages": [
        S, {"role": "user", "content": "Weather?", "task": "action"},
    ]}),
    ("task_query", {"messages": [
        S, {"role": "user", "content": "Weather?", "task": "query"},
    ]}),
]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flatten(content):
    if isinstance(content, list):
        return "\n\n".join(part["text"] for part in content)
    return content


def encoder_messages(request):
    msgs = []
    for m in request["messages"]:
        m = copy.deepcopy(m)
        if "content" in m:
            m["content"] = flatten(m["content"])
        msgs.append(m)
    tools = request.get("tools")
    if tools:
        if msgs and msgs[0]["role"] in ("system", "developer"):
            msgs[0]["tools"] = tools
        else:
            msgs.insert(0, {"role": "system", "tools": tools})
    return msgs


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    enc_dir = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "text", "chat")
    encoders = {
        "v32": load(os.path.join(enc_dir, "encoding_dsv32.py"), "encoding_dsv32"),
        "v4": load(os.path.join(enc_dir, "encoding_dsv4.py"), "encoding_dsv4"),
    }
    os.makedirs(out_dir, exist_ok=True)
    total = 0
    for n, (name, request) in enumerate(CONVERSATIONS):
        renderings = []
        drop = request.get("chat_template_kwargs", {}).get("drop_thinking", True)
        effort = request.get("reasoning_effort")
        for fmt, enc in encoders.items():
            for thinking in (False, True):
                kwargs = {"thinking_mode": "thinking" if thinking else "chat", "drop_thinking": drop}
                if fmt == "v4":
                    kwargs["reasoning_effort"] = effort
                try:
                    prompt = enc.encode_messages(encoder_messages(request), **kwargs)
                except Exception as err:  # the official encoder refuses this combination
                    print(f"{name}: {fmt} thinking={thinking}: refused ({type(err).__name__}: {err})"
                          .splitlines()[0])
                    continue
                renderings.append({"format": fmt, "thinking": thinking, "prompt": prompt})
        total += len(renderings)
        path = os.path.join(out_dir, f"{n:02d}_{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"name": name, "request": request, "renderings": renderings}, f,
                      ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"wrote {len(CONVERSATIONS)} conversations, {total} renderings to {out_dir}")


if __name__ == "__main__":
    main()
