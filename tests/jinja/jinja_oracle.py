"""The oracle of crescent's Jinja renderer: Debian's python3-jinja2 set up as Hugging Face's
apply_chat_template sets it up (transformers' chat_template_utils: an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and the {% generation %} tag, a tojson filter that is
json.dumps without HTML escaping, and the raise_exception and strftime_now globals).

Run with /usr/bin/python3 (where install-deps puts python3-jinja2). Reads JSON lines on stdin, one case a
line, and writes one JSON line per case:
  {"template": T, "variables": {...}, "trim_blocks": true, "lstrip_blocks": true}
      renders T with the variables (keyword arguments of render()).
  {"chat_config": PATH, "messages": [...], "add_generation_prompt": B, "extra": {...}}
      renders PATH's (a tokenizer_config.json) chat_template as apply_chat_template(messages,
      tokenize=False, add_generation_prompt=B, **extra) does: the special tokens of the config
      (bos_token, eos_token, ..., additional_special_tokens) and `extra` as variables, `tools` and
      `documents` None unless `extra` has them.
Answers {"ok": true, "text": "..."} or {"ok": false, "error": "TypeName: message", "line": N}, N the template
line jinja2 points at (its syntax error's, or the traceback's innermost template frame; 0 when neither).
"""

import json
import sys
import traceback
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token", "additional_special_tokens"]


class GenerationTag(jinja2.ext.Extension):
    """Hugging Face's {% generation %}...{% endgeneration %}: the body renders as is (a call block)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


_environments = {}


def environment(trim_blocks, lstrip_blocks):
    key = (trim_blocks, lstrip_blocks)
    if key not in _environments:
        env = ImmutableSandboxedEnvironment(trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks,
                                            extensions=[GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        _environments[key] = env
    return _environments[key]


def special_tokens(config):
    """transformers' special_tokens_map: each special token attribute that is set, as a string."""
    def text(token):
        return token.get("content") if isinstance(token, dict) else token

    tokens = {}
    for name in SPECIAL_TOKEN_ATTRIBUTES:
        value = config.get(name)
        if isinstance(value, list):
            value = [text(t) for t in value]
        else:
            value = text(value)
        if value:
            tokens[name] = value
    return tokens


def chat_template_of(config):
    template = config["chat_template"]
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}["default"]
    return template


_chat_templates = {}


def chat_template(path):
    """The compiled chat template of the tokenizer_config.json at `path` and its special tokens (cached)."""
    if path not in _chat_templates:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        template = environment(True, True).from_string(chat_template_of(config))
        _chat_templates[path] = (template, special_tokens(config))
    return _chat_templates[path]


def render(case):
    if "chat_config" in case:
        template, tokens = chat_template(case["chat_config"])
        extra = dict(case.get("extra", {}))
        tools = extra.pop("tools", None)
        documents = extra.pop("documents", None)
        kwargs = {**tokens, **extra}
        return template.render(messages=case["messages"], tools=tools, documents=documents,
                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
    env = environment(case.get("trim_blocks", True), case.get("lstrip_blocks", True))
    return env.from_string(case["template"]).render(**case.get("variables", {}))


def error_line(error):
    if isinstance(error, jinja2.exceptions.TemplateSyntaxError) and error.lineno:
        return error.lineno
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<template>"]
    return frames[-1].lineno if frames else 0


def main():
    for line in sys.stdin:
        case = json.loads(line)
        try:
            text = render(case)
            text.encode("utf-8")  # a lone surrogate (from a "\ud800" literal) is not text crescent can hold
            answer = {"ok": True, "text": text}
        except Exception as e:  # every failure is an answer: the case expects an error
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}", "line": error_line(e)}
        sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
