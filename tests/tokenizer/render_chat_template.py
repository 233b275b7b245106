#!/usr/bin/env python3
"""Renders tests/tokenizer/data/chat_template_cases.json with python3-jinja2 and the real Qwen3.5
template text, the way Hugging Face transformers does (apply_chat_template: a sandboxed
environment with trim_blocks and lstrip_blocks, loop controls, raise_exception, and `tojson`
replaced by json.dumps(ensure_ascii=False) without sorting keys). OpenAI-shaped tool calls carry
`arguments` as a JSON string; like vLLM, they are parsed to objects before rendering.

Each case is also rendered with the Qwen3.6 form of the template: the same text with the one
branch Qwen3.6 adds, `(preserve_thinking is defined and preserve_thinking is true) or (...)`
around the reasoning condition (derived here by replacing that line, so the 3.6 data is this
file's doing, not a copy of Qwen's 3.6 file): "text_36" / "error_36".

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
        text35 = f.read()
    branch35 = "{%- if loop.index0 > ns.last_query_index %}"
    branch36 = ("{%- if (preserve_thinking is defined and preserve_thinking is true) or "
                "(loop.index0 > ns.last_query_index) %}")
    assert text35.count(branch35) == 1
    templates = {"": env.from_string(text35),
                 "_36": env.from_string(text35.replace(branch35, branch36))}
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
        for key in ("enable_thinking", "preserve_thinking"):
            if key in case:
                kwargs[key] = case[key]
        result = {"name": case["name"]}
        for suffix, template in templates.items():
            try:
                result["text" + suffix] = template.render(**kwargs)
            except TemplateError as e:
                result["error" + suffix] = str(e)
        out.append(result)
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
