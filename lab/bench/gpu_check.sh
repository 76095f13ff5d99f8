#!/usr/bin/env bash
# The GPU check of issue 20.4, prepared for the lent machine (one CUDA GPU, torch and
# transformers, no network): hf engine generation and the sharded learner's step in bf16,
# tokens per second and peak memory (lab/bench/gpu_check.py says what each part is).
#   bash lab/bench/gpu_check.sh        # writes $OUT/gpu_check.json (the device tool's $OUT), else
#                                  # lab/bench/results/gpu_check.json; bounded to 8 minutes
# On a machine without a GPU: python -m lab.bench.gpu_check --device cpu --small (a dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}/gpu_check.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 470 python -m lab.bench.gpu_check --device cuda --out "$out" >/dev/null
python - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
g = d["generate"]
print("generate:", g.get("generated_tokens_per_s"), "tokens/s, peak", g.get("peak_gib"), "GiB")
for s in d["learner"].get("summary", []):
    print("learner:", s["config"], s["mode"], s["strategy"], s["world_size"], "ok" if s["ok"] else
          ("OOM" if s["oom"] else "FAILED"), s.get("tokens_per_s_rank0"), "tokens/s, peak",
          s.get("peak_gib_max_rank"), "GiB")
print("wall", d["wall_s"], "s ->", sys.argv[1])
PY
