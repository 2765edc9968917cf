#!/usr/bin/env bash
# Issue 16's GPU checks of CUDA IPC and the Python package (budget: 55 s in run_all.sh). Nothing
# compiles here: the wheel and the binaries come from the staged build (BUILD, scripts/gpu/stage.sh,
# which runs scripts/build_wheel.sh into BUILD/wheels; else .gpu/wheels).
#   1. pip install --no-deps --no-index --target the wheel
#   2. package_check.py: import gpumem, gpumem.install(), 20 training steps, stats vs torch's,
#      snapshot + report, an OOM postmortem judged alike by gpumem.report and the gpumem tool
#   3. ipc_check.py: torch.multiprocessing between gpumem processes both ways (data, writes,
#      lifetimes) and with PyTorch's own allocator both ways; gpumem.install() after CUDA starts
#   4. bench/ipc_pieces: cuMemCreate with and without exportable pieces; export/import costs
#   5. tests/torch/torch_ipc: the CPU-side IPC tests (handle bytes, descriptor passing, imports)
# Steps 2 and 3 run at the same time (each spends most of its time starting torch and CUDA).
#
#   OUT=/dir scripts/gpu/package.sh        ($OUT gets package-summary.txt and package-logs.tar.gz)
#   WHEELS=dir (default BUILD/wheels, else .gpu/wheels)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
# stage.sh puts the wheel into the staged build; scripts/build_wheel.sh's default is .gpu/wheels.
if [ -z "${WHEELS:-}" ]; then
  WHEELS=$BUILD/wheels
  ls "$WHEELS"/gpumem-*.whl >/dev/null 2>&1 || WHEELS=$gpu_root/.gpu/wheels
fi
logs=$OUT/package-logs
mkdir -p "$logs"
summary=$OUT/package-summary.txt
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
trap 'tar czf "$OUT/package-logs.tar.gz" -C "$OUT" package-logs && rm -rf "$logs"' EXIT
t_all=$SECONDS

site=$(mktemp -d /tmp/gpumem-site.XXXXXX)
wheel=$(ls "$WHEELS"/gpumem-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  note "package: FAILED: no gpumem wheel in $WHEELS (make it with scripts/build_wheel.sh)"; exit 1
fi
t0=$SECONDS
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  # No pip: a wheel is a zip; unpacked, it is the package without its console script.
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$site" &&
    chmod +x "$site"/gpumem/bin/gpumem
  note "pip install $(basename "$wheel"): no pip for $PY; unpacked the wheel instead ($((SECONDS - t0)) s)"
elif timeout 60 "$PY" -m pip install --quiet --no-deps --no-index --target "$site" "$wheel" >"$logs/pip.log" 2>&1; then
  note "pip install $(basename "$wheel"): ok ($((SECONDS - t0)) s)"
else
  note "pip install $(basename "$wheel"): FAILED (pip.log)"; tail -20 "$logs/pip.log"; exit 1
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
unset GPUMEM_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF

t0=$SECONDS
PYTHONUNBUFFERED=1 timeout 40 "$PY" scripts/gpu/package/package_check.py --out "$logs" --site "$site" \
  >"$logs/package_check.log" 2>&1 &
pkg_pid=$!
PYTHONUNBUFFERED=1 timeout 40 "$PY" scripts/gpu/package/ipc_check.py --timeout 30 >"$logs/ipc_check.log" 2>&1 &
ipc_pid=$!
wait $pkg_pid; pkg_rc=$?
wait $ipc_pid; ipc_rc=$?
for name in package_check ipc_check; do
  rc=$pkg_rc; [ $name = ipc_check ] && rc=$ipc_rc
  if [ $rc = 0 ]; then
    note "$name: passed ($(grep -c '^ok:' "$logs/$name.log") checks$(grep -q '^skip:' "$logs/$name.log" && echo ", $(grep -c '^skip:' "$logs/$name.log") skipped"))"
  else
    note "$name: FAILED (exit $rc$([ $rc -ge 124 ] && echo ': timed out'))"; status=1
  fi
  grep -E '^(FAIL|skip):' "$logs/$name.log" | head -8 | tee -a "$summary"
  [ $rc = 0 ] || tail -15 "$logs/$name.log"
done
note "  (python checks: $((SECONDS - t0)) s)"

if [ -x "$BUILD/bench/ipc_pieces" ]; then
  if timeout 25 "$BUILD/bench/ipc_pieces" --pieces 16 --rounds 2 >"$logs/ipc_pieces.log" 2>&1; then
    note "ipc_pieces:"; tee -a "$summary" <"$logs/ipc_pieces.log"
  else
    note "ipc_pieces: FAILED (exit $?)"; tail -5 "$logs/ipc_pieces.log" | tee -a "$summary"; status=1
  fi
else
  note "ipc_pieces: MISSING ($BUILD/bench/ipc_pieces)"; status=1
fi
if [ -x "$BUILD/tests/torch/torch_ipc" ]; then
  if timeout 20 "$BUILD/tests/torch/torch_ipc" --order lex >"$logs/torch_ipc.log" 2>&1; then
    note "torch_ipc: passed ($(grep -E 'All tests passed|test cases' "$logs/torch_ipc.log" | tail -1))"
  else
    note "torch_ipc: FAILED"; tail -15 "$logs/torch_ipc.log"; status=1
  fi
fi
rm -rf "$site"
note "package: $([ $status = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - t_all)) s"
exit $status
