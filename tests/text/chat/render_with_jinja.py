#!/usr/bin/env python3
"""Renders a model's own chat template (tokenizer.chat_template of a GGUF file, or a .jinja file)
with jinja2 the way Hugging Face transformers does (trim_blocks, lstrip_blocks, loop controls,
tojson without ASCII escapes, raise_exception, strftime_now), for every case of a cases file:

  render_with_jinja.py MODEL.gguf|TEMPLATE.jinja CASES.json DATE BOS_TEXT > renderings.json

CASES.json: [{"messages": [...], "add_generation_prompt": bool, "kwargs": {...}}, ...]; DATE is
what strftime_now("%Y-%m-%d") returns. Prints a JSON list of the rendered strings (null where the
template raised an exception). The independent reference for tandem's C++ renderers."""
import json
import struct
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


def gguf_chat_template(path):
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))

        def read_string():
            (n,) = read("Q")
            return f.read(n).decode("utf-8")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def read_value(kind):
            if kind == 8:
                return read_string()
            if kind == 9:
                (item_kind,) = read("I")
                (n,) = read("Q")
                return [read_value(item_kind) for _ in range(n)]
            return read(scalar[kind])[0]

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        read("I")  # version
        read("Q")  # tensors
        (n_keys,) = read("Q")
        for _ in range(n_keys):
            key = read_string()
            (kind,) = read("I")
            value = read_value(kind)
            if key == "tokenizer.chat_template":
                return value
    raise SystemExit(f"{path}: no tokenizer.chat_template")


def main():
    source_path, cases_path, date, bos = sys.argv[1:5]
    source = gguf_chat_template(source_path) if source_path.endswith(".gguf") else open(source_path).read()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: date if fmt == "%Y-%m-%d" else date
    template = env.from_string(source)
    out = []
    for case in json.load(open(cases_path)):
        try:
            out.append(template.render(messages=case["messages"],
                                       add_generation_prompt=case.get("add_generation_prompt", True),
                                       bos_token=bos, **case.get("kwargs", {})))
        except jinja2.exceptions.TemplateError:
            out.append(None)
    json.dump(out, sys.stdout, ensure_ascii=False)


main()
