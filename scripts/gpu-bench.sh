#!/usr/bin/env bash
# Every GPU measurement of the project in one process tree, for a machine with one CUDA GPU and the
# project's checkout as the working directory: engine CUDA-graph checks, the 27B-shape decode, GDN and arm
# benchmarks, a per-kernel profile of the arms' steps, the GPU audits and the replay of a recorded corpus on the
# built-in model. Steps ncu_scan and ncu_wy read the sidecar scan's and the wy verifier's hardware counters
# (stall reasons, occupancy) with Nsight Compute into NAME.log and their per-instruction stall samples into
# NAME_source.csv (ncu_wy: the wy config WY_NCU, two launches); step gdn_sweep times scan knob sets (GDN_CONFIGS overrides them); steps gdn_wy and arms_wy
# serve the matrix-form verifier (plan_mode=wy; gdn_wy times the wy configs WY_CONFIGS, else bench gdn's list);
# steps gdn_best, arms_wy and audit_best serve the fastest wy config gdn_wy, else gdn, found within the paired
# rule (plan_mode auto: wy for trees of up to wy_max_rows rows, as served by default); step profile_graphs profiles
# CUDA-graph steps, whose device idle gaps show the host work a step cannot hide; step probe times a node of
# the scan taken apart (bench/analysis/scan_probe.py).
# Usage: bash scripts/gpu-bench.sh OUT_DIR [STEP ...]   (steps default to all; each has its own time cap,
# and a failing step is recorded and skipped so one broken piece never costs the others).
set -uo pipefail
out=${1:?usage: gpu-bench.sh OUT_DIR [STEP ...]}; shift
mkdir -p "$out"
repo=$(pwd)
# The checkout is the package root: expose it as `lumotree` without installing.
pkgroot=$(mktemp -d); ln -s "$repo" "$pkgroot/lumotree"
export PYTHONPATH="$pkgroot${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
lt=(python3 -m lumotree.platform.cli)
# Wheels carried beside the checkout (fla-core; sqlalchemy and alembic for the replay store) when present.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$pkgroot/site" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$pkgroot/site"
fi
# Provenance names the commit recorded beside a copied tree (its git metadata may be older than its files).
[ -f .commit ] && export LUMOTREE_COMMIT=$(head -c 12 .commit)
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(env tests tests_gather decode gdn gdn_wy gdn_best gdn_sweep ncu_scan ncu_wy probe arms arms_wy arms_gather profile profile_graphs profile_tiny audit audit_best replay)
status=0
run_step() {  # name cap command...
  local name=$1 cap=$2; shift 2
  echo "=== $name (cap ${cap}s) ==="
  local t0=$SECONDS
  timeout --kill-after=10 "$cap" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$out/steps.txt"
  tail -n 25 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
}
wy_scan() {  # LUMOTREE_TREE_SCAN serving the fastest wy config of step gdn_wy (else gdn) within the paired rule;
  # WY_FROM names a gdn_wy JSON of an earlier call to read first (a sweep split over two calls)
  python3 - ${WY_FROM:+"$WY_FROM"} "$out/gdn_27b_wy.json" "$out/gdn_27b.json" <<'EOF'
import json, sys
best = {}  # neither step ran or found one: the default wy config
for path in sys.argv[1:]:
    try:
        best = json.load(open(path))["verify_fastest_within_rule_per_plan"]["wy"]
        break
    except (OSError, KeyError, ValueError):
        pass
if best.get("cells_outside_paired_bound", 0):
    best = {}  # no wy config kept to the rule: the default, whose audit will say so
print(",".join(["plan_mode=auto", *(f"{k}={v}" for k, v in best.items() if k.startswith("wy_"))]))
EOF
}
run_best() {  # name cap command...: run_step serving the fastest wy config found (wy_scan)
  local name=$1 cap=$2 scan; shift 2
  scan=$(wy_scan); echo "$name serves LUMOTREE_TREE_SCAN=$scan" | tee -a "$out/steps.txt"
  run_step "$name" "$cap" env LUMOTREE_TREE_SCAN="$scan" "$@"
}
ncu_step() {  # name kernel-regex launches bench-gdn-args...: the first launches of the kernels through Nsight Compute
  local name=$1 kernel=$2 count=$3; shift 3
  run_step "$name" 300 bash -c "ncu --clock-control none --cache-control none --section SpeedOfLight \
--section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
--section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --import-source no \
-k 'regex:$kernel' -c $count -f -o /tmp/$name ${lt[*]} bench gdn --layers 1 --warmup 1 --iters 2 $* --json \
--out /tmp/$name.json >/dev/null && ncu -i /tmp/$name.ncu-rep --print-details all && \
ncu -i /tmp/$name.ncu-rep --page source --print-source sass --csv > '$out/${name}_source.csv'"
}
for s in "${steps[@]}"; do
  case $s in
    env) run_step env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'; \
cat '$repo/.commit' 2>/dev/null || git -C '$repo' rev-parse HEAD" ;;
    tests) run_step tests 260 python3 -m pytest -q -p no:cacheprovider --import-mode=importlib \
      tests/serving/test_engine_cuda.py tests/serving/test_graphs.py tests/serving/test_walk_static.py \
      tests/kernels/test_norm_cuda.py tests/kernels/test_tree_scan_cuda.py tests/serving/test_upload.py tests/serving/test_span_timer.py ;;
    tests_gather) run_step tests_gather 200 env LUMOTREE_GDN_STATE=gather python3 -m pytest -q -p no:cacheprovider \
      --import-mode=importlib tests/serving/test_engine_cuda.py tests/serving/test_graphs.py ;;
    decode) run_step decode 240 "${lt[@]}" bench decode --shapes 27b --batch 1 --context 1024 --variants fused,gather --json --out "$out/decode_27b.json" ;;
    gdn) run_step gdn 240 "${lt[@]}" bench gdn --json --out "$out/gdn_27b.json" ;;
    gdn_wy) run_step gdn_wy 240 env LUMOTREE_TREE_SCAN=plan_mode=wy "${lt[@]}" bench gdn --plans sidecar,wy --json \
      ${WY_CONFIGS:+--wy-configs "$WY_CONFIGS"} --out "$out/gdn_27b_wy.json" ;;
    gdn_sweep) run_step gdn_sweep 300 "${lt[@]}" bench gdn --plans sidecar,split --warmup 10 --iters 50 --json \
      --configs ${GDN_CONFIGS:-8:1:1,8:1:2,8:1:1/maxnreg=128,8:1:1/maxnreg=112,8:1:2/maxnreg=128} \
      --out "$out/gdn_sweep.json" ;;
    ncu_scan) ncu_step ncu_scan _tree_scan_kernel 1 --plans sidecar --configs 8:1:1 ;;
    ncu_wy) ncu_step ncu_wy '_tree_wy_kernel' 2 --plans wy --wy-configs "${WY_NCU:-64:4:16}" ;;
    probe) run_step probe 240 python3 bench/analysis/scan_probe.py --out "$out/scan_probe.json" ;;
    arms) run_step arms 300 "${lt[@]}" bench arms --shapes 27b --device cuda --draft-vocab 32768 --json \
      --out "$out/arms_27b.json" ;;
    gdn_best) run_best gdn_best 240 "${lt[@]}" bench gdn --plans sidecar --json --out "$out/gdn_27b_best.json" ;;
    arms_wy) run_best arms_wy 300 "${lt[@]}" bench arms --shapes 27b --device cuda --draft-vocab 32768 --json \
      --out "$out/arms_27b_wy.json" ;;
    audit_best) run_best audit_best 200 "${lt[@]}" audit all --device cuda --model tiny --shapes 27b --json \
      --out "$out/audit_best" ;;
    arms_gather) run_step arms_gather 300 env LUMOTREE_GDN_STATE=gather "${lt[@]}" bench arms --shapes 27b --device cuda \
      --draft-vocab 32768 --json --out "$out/arms_27b_gather.json" ;;
    profile) run_step profile 300 "${lt[@]}" bench profile --shapes 27b --device cuda --draft-vocab 32768 \
      --arms ar,mtp5_dv,lumotree_dv --json --out "$out/profile_27b.json" ;;
    profile_graphs) run_step profile_graphs 300 "${lt[@]}" bench profile --shapes 27b --device cuda --draft-vocab 32768 \
      --arms mtp5_dv,lumotree_dv --cuda-graphs --json --out "$out/profile_27b_graphs.json" ;;
    profile_tiny) run_step profile_tiny 300 bash -c "${lt[*]} bench profile --model tiny --device cuda \
      --arms ar,mtp5,eagle,lumotree --cuda-graphs --json --out '$out/profile_tiny_graphs.json' && \
      ${lt[*]} bench profile --model tiny --device cuda --arms ar,mtp5,eagle,lumotree --json \
      --out '$out/profile_tiny.json'" ;;
    audit) run_step audit 200 "${lt[@]}" audit all --device cuda --model tiny --shapes 27b --json --out "$out/audit" ;;
    replay) run_step replay 240 "${lt[@]}" replay --corpus bench/replay-corpus.jsonl --limit 16 --arms ar,mtp,eagle,lumotree --runs 3 \
      --max-tokens 256 --no-ray --device cuda --db "sqlite:///$out/replay.db" --out "$out/replay.json" --json ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
exit $status
