#!/usr/bin/env bash
# The device check: the CUDA-visible test suite, the bitwise checks and the GPU benchmarks, in one
# go, ending with one table (docs/workloads.md, "The device check"). From the checkout's root:
#
#   bash bench/gpu_check.sh                      # everything (about 8 minutes on one H200 node)
#   PARTS="bitwise bench" bash bench/gpu_check.sh
#
# Parts: suite (tests/unit and tests/e2e with CUDA visible, then tests/mpi at 2 and 3 ranks sharing
# the GPU), shapes (a client's kernel shapes in vectorised blocks on 1, 2 and 3 ranks' placements,
# tests/unit/test_block_shapes.py on the GPU, under a minute), bitwise (the same job twice; 1, 2 and
# 3 ranks; killed and resumed), bench (VGG-11 and
# W against the bare GPU loop, deterministic on and off, per-client state memory). It also runs
# without a GPU (everything on the CPU, the benchmarks then say so). Logs and the table go to
# $OUT (default ./gpu_check); a part that fails is marked in the table and the rest still runs.
# A node without MPI or network: see docs/workloads.md for the wheels to bring (mpich, mpi4py,
# pytest-mpi) and `. .whl/prelude.sh`.
set -u
OUT=${OUT:-gpu_check}
PARTS=${PARTS:-suite shapes bitwise bench}
PY=${PY:-python3}
JOBS=${JOBS:-$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))}
mkdir -p "$OUT"
TABLE=${TABLE:-$OUT/table.txt}
: > "$TABLE"
row() { printf '%-58s %s\n' "$1" "$2" | tee -a "$TABLE"; }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
MPIRUN() { n=$1; shift; mpiexec -n "$n" "$PY" -m mpi4py "$@"; }

row "device" "$($PY -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)")')"
row "torch / CUDA" "$($PY -c 'import torch; print(torch.__version__, torch.version.cuda or "-")')"

if has suite; then
  t0=$SECONDS
  timeout 420 "$PY" -m pytest -q -n "$JOBS" --dist loadfile -p no:cacheprovider -rfE --tb=short \
    tests/unit tests/e2e > "$OUT/suite.log" 2>&1
  row "suite: unit + e2e, CUDA visible (rc, s)" "$? $((SECONDS - t0))  $(grep -E '(passed|failed)' "$OUT/suite.log" | tail -1)"
  for n in 2 3; do
    t0=$SECONDS
    timeout 300 mpiexec -n "$n" "$PY" -m mpi4py -m pytest --with-mpi -q -p no:cacheprovider tests/mpi \
      > "$OUT/mpi$n.log" 2>&1
    row "suite: tests/mpi on $n ranks, one GPU (rc, s)" "$? $((SECONDS - t0))  $(grep -E '(passed|failed)' "$OUT/mpi$n.log" | tail -1)"
  done
fi

if has shapes; then   # vectorised blocks: every kernel call of a client has the same shapes on 1, 2, 3 ranks
  dev=$($PY -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
  t0=$SECONDS
  HPCFL_SHAPES_DEVICE=$dev timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/unit/test_block_shapes.py -k same_shapes > "$OUT/shapes.log" 2>&1
  rc=$?
  diff=$(grep -m1 -oE "client at cohort position [^\"]{0,160}" "$OUT/shapes.log")
  if [ $rc = 0 ]; then msg="same shapes on 1, 2, 3 ranks"
  elif [ -n "$diff" ]; then msg="DIFFERENT: $diff"
  else msg="FAILED rc $rc (same shapes, other results? see shapes.log)"; fi
  row "shapes: a client's kernels in blocks, on $dev (s)" "$msg  $((SECONDS - t0))"
fi

if has bitwise; then
  # one torch thread on every rank: CPU kernels round differently at other thread counts (README, Reproducibility)
  # runtime.share_gpus: 2 and 3 ranks on this machine's one GPU (refused without it, docs/guide.md, Devices)
  W="${WJOB:-jobs/bench_w.toml} --set run.rounds=4 --set run.eval_every=2 --set runtime.threads=1 --set runtime.progress=none --set runtime.share_gpus=true --force"
  same() { "$PY" - "$@" <<'EOF'
import sys
import numpy as np
from hpcfl.results import load
a = load(sys.argv[1])
for other in sys.argv[2:]:
    b = load(other)
    ok = a.final_params.tobytes() == b.final_params.tobytes() and all(
        np.array_equal(a.metrics[k], b.metrics[k], equal_nan=True) for k in a.metrics if not k.startswith("time_"))
    print("bitwise equal" if ok else "DIFFERENT", end="; ")
EOF
  }
  "$PY" -m hpcfl run $W --out "$OUT/w1" > "$OUT/bitwise.log" 2>&1
  "$PY" -m hpcfl run $W --out "$OUT/w1b" >> "$OUT/bitwise.log" 2>&1
  row "bitwise: W (LeNet-5) twice on 1 rank" "$(same "$OUT/w1" "$OUT/w1b")"
  for n in 2 3; do
    MPIRUN "$n" -m hpcfl run $W --out "$OUT/w$n" >> "$OUT/bitwise.log" 2>&1
  done
  row "bitwise: W on 2 and 3 ranks vs 1 rank" "$(same "$OUT/w1" "$OUT/w2" "$OUT/w3")"
  # killed (SIGKILL) once its first checkpoint is on disk, then resumed by the same command on 2 ranks
  "$PY" -m hpcfl run $W --set checkpoint.every=1 --out "$OUT/wk" >> "$OUT/bitwise.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do ls "$OUT"/wk/checkpoints/*.h5 > /dev/null 2>&1 && break; sleep 0.1; done
  kill -9 "$pid" 2> /dev/null; wait "$pid" 2> /dev/null
  MPIRUN 2 -m hpcfl run ${W% --force} --set checkpoint.every=1 --out "$OUT/wk" >> "$OUT/bitwise.log" 2>&1
  row "bitwise: W killed on 1 rank, resumed on 2" "$(same "$OUT/w1" "$OUT/wk")"
  "$PY" -m hpcfl run $W --set runtime.vectorize=on --out "$OUT/wv1" >> "$OUT/bitwise.log" 2>&1
  MPIRUN 2 -m hpcfl run $W --set runtime.vectorize=on --out "$OUT/wv2" >> "$OUT/bitwise.log" 2>&1
  row "bitwise: W vectorised, 2 ranks vs 1" "$(same "$OUT/wv1" "$OUT/wv2")"
fi

if has bench; then
  B="timeout 300 $PY -m hpcfl bench"
  L=1x$(nproc)
  first() { grep -E "^  $1 " | head -1 | awk '{print $2}'; }
  ratio() { grep -E "ratio hpcfl" | head -1 | sed -E 's/.*: ([0-9.]+x).*/\1/'; }
  $B vgg11 --layout "$L" --set runtime.vectorize=off > "$OUT/vgg_exact.log" 2>&1
  row "VGG-11 exact, sequential: hpcfl / bare s/round" "$(first hpcfl < "$OUT/vgg_exact.log") / $(first bare < "$OUT/vgg_exact.log") = $(ratio < "$OUT/vgg_exact.log")"
  $B W --layout "$L" --rounds 6 --set runtime.vectorize=off > "$OUT/w_seq.log" 2>&1
  row "W sequential: hpcfl / bare s/round" "$(first hpcfl < "$OUT/w_seq.log") / $(first bare < "$OUT/w_seq.log") = $(ratio < "$OUT/w_seq.log")"
  $B W --layout "$L" --rounds 6 --set runtime.vectorize=off --set runtime.deterministic=false --only hpcfl \
    > "$OUT/w_nondet.log" 2>&1
  row "W sequential, deterministic off: hpcfl s/round" "$(first hpcfl < "$OUT/w_nondet.log")"
  $B W --layout "$L" --rounds 6 --set runtime.vectorize=on --bare-vmap > "$OUT/w_vmap.log" 2>&1
  row "W vectorised: hpcfl / bare vmap s/round" "$(first hpcfl < "$OUT/w_vmap.log") / $(first bare < "$OUT/w_vmap.log") = $(ratio < "$OUT/w_vmap.log")"
  $B vgg11 --layout "$L" --set runtime.vectorize=off --set runtime.reduce=float --only hpcfl > "$OUT/vgg_float.log" 2>&1
  row "VGG-11 float reduce, sequential: hpcfl s/round" "$(first hpcfl < "$OUT/vgg_float.log")"
  timeout 120 "$PY" bench/client_state_memory.py > "$OUT/memory.log" 2>&1
  row "per-client state, 1,000 clients x 62k params (SCAFFOLD)" "$(tail -1 "$OUT/memory.log")"
  $B vgg11 --layout "$L" --bare-vmap > "$OUT/vgg_auto.log" 2>&1
  row "VGG-11 exact, vectorize auto vs bare vmap" "$(first hpcfl < "$OUT/vgg_auto.log") / $(first bare < "$OUT/vgg_auto.log") = $(ratio < "$OUT/vgg_auto.log")"
fi

if has profile; then   # not in the default parts: where a VGG-11 round's time goes (torch.profiler)
  timeout 120 "$PY" bench/profile_round.py --set runtime.vectorize=off > "$OUT/profile.log" 2>&1
  row "profile of a VGG-11 round (see profile.log)" "rc $?"
fi
echo
echo "== device check =="
cat "$TABLE"
