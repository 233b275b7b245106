#!/usr/bin/env python3
"""Renders tests/tokenizer/data/chat_template_cases.json with python3-jinja2 and the real Qwen3.5
template text, the way Hugging Face transformers does (apply_chat_template: a sandboxed
environment with trim_blocks and lstrip_blocks, loop controls, raise_exception, and `tojson`
replaced by json.dumps(ensure_ascii=False) without sorting keys). OpenAI-shaped tool calls carry
`arguments` as a JSON string; like vLLM, they are parsed to objects before rendering.

  render_chat_template.py            rewrite data/chat_template_expected.json
  render_chat_template.py --check    exit 1 if the file differs from a fresh rendering
"""
import json
import os
import sys

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render_all():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(DATA, "qwen3.5_chat_template.jinja"), encoding="utf-8") as f:
        template = env.from_string(f.read())
    with open(os.path.join(DATA, "chat_template_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        messages = json.loads(json.dumps(case["messages"]))
        for m in messages:
            for call in m.get("tool_calls") or []:
                fn = call.get("function", {})
                if isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.loads(fn["arguments"])
        kwargs = {"messages": messages,
                  "add_generation_prompt": case.get("add_generation_prompt", True)}
        if "tools" in case:
            kwargs["tools"] = case["tools"]
        if "enable_thinking" in case:
            kwargs["enable_thinking"] = case["enable_thinking"]
        try:
            out.append({"name": case["name"], "text": template.render(**kwargs)})
        except TemplateError as e:
            out.append({"name": case["name"], "error": str(e)})
    return json.dumps(out, ensure_ascii=False, indent=1) + "\n"


def main():
    path = os.path.join(DATA, "chat_template_expected.json")
    fresh = render_all()
    if "--check" in sys.argv:
        with open(path, encoding="utf-8") as f:
            if f.read() != fresh:
                print("chat_template_expected.json is stale: run", sys.argv[0])
                return 1
        print("chat_template_expected.json matches python3-jinja2")
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
