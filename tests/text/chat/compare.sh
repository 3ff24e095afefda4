#!/usr/bin/env bash
# compare.sh TANDEM PYTHON_WITH_JINJA2 MODEL.gguf CASES.json: every conversation of CASES rendered
# by `tandem apply-template` must be byte for byte what jinja2 renders from the model's own
# tokenizer.chat_template (render_with_jinja.py, transformers' settings); Harmony's date pinned.
set -euo pipefail
tandem=$1 python=$2 model=$3 cases=$4
here=$(dirname "$0")
if ! "$python" -c "import jinja2" 2>/dev/null; then
  echo "$python cannot import jinja2: install python3-jinja2 (tools/install-deps.sh does)" >&2
  exit 1
fi
ours=$(mktemp) ref=$(mktemp)
trap 'rm -f "$ours" "$ref"' EXIT
bos=$("$python" - "$model" <<'PY'
import sys, struct
# The BOS token's text, for templates that write bos_token.
f = open(sys.argv[1], "rb"); f.read(4); struct.unpack("<I", f.read(4)); struct.unpack("<Q", f.read(8))
(n,) = struct.unpack("<Q", f.read(8))
def s(): (k,) = struct.unpack("<Q", f.read(8)); return f.read(k).decode()
sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def v(t):
    if t == 8: return s()
    if t == 9:
        (it,) = struct.unpack("<I", f.read(4)); (m,) = struct.unpack("<Q", f.read(8))
        return [v(it) for _ in range(m)]
    raw = f.read(sizes[t]); return int.from_bytes(raw, "little")
meta = {}
for _ in range(n):
    k = s(); (t,) = struct.unpack("<I", f.read(4)); meta[k] = v(t)
bos = meta.get("tokenizer.ggml.bos_token_id")
print(meta["tokenizer.ggml.tokens"][bos] if bos is not None else "", end="")
PY
)
"$tandem" apply-template "$model" --cases "$cases" --date 2025-08-05 > "$ours"
"$python" "$here/render_with_jinja.py" "$model" "$cases" 2025-08-05 "$bos" > "$ref"
"$python" - "$ours" "$ref" "$cases" <<'PY'
import json, sys
ours, ref, cases = (json.load(open(p)) for p in sys.argv[1:4])
bad = 0
for i, (a, b) in enumerate(zip(ours, ref)):
    if a != b:
        bad += 1
        print(f"case {i}: {json.dumps(cases[i]['messages'], ensure_ascii=False)[:200]}")
        print(f"  tandem: {a!r}")
        print(f"  jinja2: {b!r}")
print(f"{len(ours) - bad}/{len(ours)} conversations rendered as the model's own template does")
sys.exit(1 if bad or len(ours) != len(ref) else 0)
PY
