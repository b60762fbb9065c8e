#!/usr/bin/env bash
# The whole test suite from a fresh clone: a virtualenv, the package built from source, pytest.
# Models the tests need are fetched from PyPI into $PYDECODE_HOME (default ~/.cache/pydecode).
#
# Then the ARM64 kernel tables, cross-compiled and checked under qemu-aarch64 (scripts/test-arm64.sh,
# which installs the cross compiler and qemu-user with apt-get where it may).
#
# Then a second stage: a copy of the package with the C core built under AddressSanitizer +
# UndefinedBehaviorSanitizer (PYDECODE_SANITIZE=1, see pydecode/_build.py) runs the tests that
# exercise the C core, with SmolLM2 and tiny models only (measured on 2 cores: the build ~1 min,
# the tests ~8). PYDECODE_SANITIZE_STAGE=0 skips it (a quick local run). The fuzz tests use atheris when it installs, else a plain
# mutation loop; under ASan always the plain loop (its runtime must not meet atheris' libFuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The sanitizer stage builds with the venv's own setuptools (setup.py): as new as the build's.
.venv/bin/python -m pip install -q --upgrade pip 'setuptools>=77' wheel 'cffi>=1.16'
# (setuptools warns at every editable install that the package folder in the working directory
# may shadow it: here that is the point, so its warnings are silenced for this one command.)
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e '.[test]'
# Coverage-guided fuzzing where atheris installs (a wheel exists for this Python), else the plain loop.
.venv/bin/python -m pip install -q 'atheris>=2.3' 2>/dev/null || echo "test.sh: atheris unavailable, fuzzing with the plain mutation loop" >&2

# The models the tests use, fetched here where the download shows (about 840 MB the first time;
# cached in $PYDECODE_HOME, default ~/.cache/pydecode, afterwards).
for m in smollm2-135m gemma3-270m qwen2.5-coder-0.5b; do
  .venv/bin/pydecode pull "$m" >/dev/null
done
# llama.cpp's tokenizer test suite, from PyPI's llama-cpp-python sdist (76 MB, once; tests/conformance.py).
.venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); import conformance; conformance.tokenizer_dir(); conformance.o200k_dir()"

banner() { printf '\ntest.sh: ==== %s ====\n\n' "$*" >&2; }
# The tests run in parallel (pytest-xdist): one worker per core, at most 4 and at most one per 3 GB
# of available memory (a worker holds the models its tests load). On CI's 2 cores this takes stage 1
# from about 12 to 9 minutes and stage 2 from 8 to 6. PYDECODE_TEST_JOBS=1 runs them one by one.
if [ -z "${PYDECODE_TEST_JOBS:-}" ]; then
  PYDECODE_TEST_JOBS=$(.venv/bin/python -c "import os
mem = next((int(l.split()[1]) for l in open('/proc/meminfo') if l.startswith('MemAvailable')), 6 << 20) \
    if os.path.exists('/proc/meminfo') else 6 << 20
print(max(1, min(os.cpu_count() or 1, 4, mem // (3 << 20))))")
fi
PAR=""
if [ "$PYDECODE_TEST_JOBS" -gt 1 ] && .venv/bin/python -c "import xdist" 2>/dev/null; then
  PAR="-n $PYDECODE_TEST_JOBS"
fi
echo "test.sh: ${PAR:-one pytest process} ($PYDECODE_TEST_JOBS job(s))" >&2
if ! .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 $PAR "$@"; then
  banner "STAGE 1 (the test suite) FAILED; stage 2 (the sanitizers) was NOT run"
  exit 1
fi
banner "stage 1 (the test suite) passed"

# ---- the sampler on the other x86 tables ----
# Sampling and structured output on the AVX2 table (what AVX2-only hosts run: stage 1 ran the best
# table here) and on the plain-C twin (its sampling tests, and the model tests on SmolLM2 only:
# whole models on the scalar table take minutes), so that "seed for seed" and the distributions
# hold on every table whichever host CI gets (once, the constrained draw did not on AVX2 only).
best=$(.venv/bin/python -c "from pydecode._core import ffi, lib; print(ffi.string(lib.pd_isa_best()).decode())")
T="tests/test_sampling.py tests/test_structured.py"
if .venv/bin/python -c "from pydecode._core import lib; raise SystemExit(not lib.pd_isa_supported(b'avx2'))"; then
  if [ "$best" != avx2 ]; then
    PYDECODE_ISA=avx2 .venv/bin/python -m pytest -q -p no:cacheprovider $PAR $T \
      || { banner "the sampler on the AVX2 table FAILED; stage 2 (the sanitizers) was NOT run"; exit 1; }
  fi
  PYDECODE_ISA=scalar .venv/bin/python -m pytest -q -p no:cacheprovider $PAR $T \
    -k "not gemma and not every_output and not speculative_decoding_keeps and not forced_runs_give and not cli_run" \
    || { banner "the sampler on the scalar table FAILED; stage 2 (the sanitizers) was NOT run"; exit 1; }
  banner "the sampler on the avx2 and scalar tables passed"
fi

# ---- the ARM64 kernel tables under qemu-aarch64 (scripts/test-arm64.sh; about 1 min) ----
arm=0
PYTHON=.venv/bin/python ./scripts/test-arm64.sh || arm=$?
case $arm in
  0) banner "ARM64 stage (kernels under qemu-aarch64) passed" ;;
  77) banner "ARM64 stage SKIPPED: no aarch64 cross compiler / qemu-user, and apt-get could not install them" ;;
  *) banner "ARM64 stage (kernels under qemu-aarch64) FAILED; stage 2 (the sanitizers) was NOT run"; exit 1 ;;
esac

stage=${PYDECODE_SANITIZE_STAGE:-1}
if [ "$stage" != 1 ]; then
  banner "stage 2 (ASan + UBSan) SKIPPED: PYDECODE_SANITIZE_STAGE=$stage"
  exit 0
fi

# ---- stage 2: ASan + UBSan ----
# (Whole-model runs on the scalar table are left to stage 1: under ASan they took 2 of its 10
# minutes, and the SIMD tables' runs of the same tests walk the same buffers.)
REPO=$PWD
SAN=$(mktemp -d "${TMPDIR:-/tmp}/pydecode-sanitize.XXXXXX")
trap 'rm -rf "$SAN"' EXIT
cp -r pydecode csrc models setup.py pyproject.toml README.md "$SAN/"
rm -f "$SAN"/pydecode/_core*.so "$SAN"/pydecode/_core.c
echo "test.sh: building the C core with -fsanitize=address,undefined in $SAN" >&2
start=$SECONDS
(cd "$SAN" && PYDECODE_SANITIZE=1 "$REPO/.venv/bin/python" setup.py -q build_ext --inplace >/dev/null)
echo "test.sh: sanitized build took $((SECONDS - start)) s" >&2
# The ASan runtime first; libstdc++ with it, or ASan cannot intercept C++ throws (sentencepiece).
export LD_PRELOAD="$(${CC:-gcc} -print-file-name=libasan.so) $(${CC:-gcc} -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH=$SAN PYDECODE_FUZZ_PLAIN=1 PYDECODE_FUZZ_SECONDS=${PYDECODE_SANITIZE_FUZZ_SECONDS:-10}
export PYDECODE_STRESS_SECONDS=8 PYDECODE_CLOSE_ROUNDS=12 PYDECODE_LONG_PROMPT_TOKENS=1200
# Run from the copy: its pydecode (with the sanitized _core) comes first on the path.
cd "$SAN"
"$REPO/.venv/bin/python" -c "import pydecode, pydecode._core as c, sys; \
assert pydecode.__file__.startswith('$SAN'), pydecode.__file__; print('test.sh: sanitized core', c.__file__)" >&2
T=$REPO/tests
"$REPO/.venv/bin/python" -m pytest -q -p no:cacheprovider -x --durations=15 $PAR \
  "$T/test_kernels.py" "$T/test_forward.py" "$T/test_cache.py" "$T/test_generation.py" "$T/test_archs.py" \
  "$T/test_sampling.py" "$T/test_hostile.py" "$T/test_verify.py" "$T/test_api.py" "$T/test_engine.py" \
  "$T/test_lifetimes.py" "$T/test_speculative.py::test_draft_model_drafts_for_every_sequence_of_a_batch" \
  "$T/test_kv_cache.py" "$T/test_iq_formats.py" "$T/test_embeddings.py" "$T/test_moe.py" "$T/test_qwen35.py" "$T/test_threads.py::test_moe_steps_oversubscribed_never_hang" \
  "$T/test_kvstate.py::test_truncated_or_flipped_anywhere_never_loads" \
  "$T/test_kvstate.py::test_refused_files_change_nothing" "$T/test_kvstate.py::test_engine_saves_a_finished_handles_slot_in_memory" \
  "$T/test_speculative.py::test_cache_after_rejections_equals_recompute" \
  "$T/test_structured.py::test_masked_argmax_and_apply_match_numpy" \
  "$T/test_structured.py::test_masked_summary_draw_is_the_masked_logits_draw" \
  "$T/test_structured.py::test_the_engine_mixes_constrained_and_free_sequences" \
  "$T/test_structured.py::test_regex_and_choices_always_match[smol-sampled]" \
  "$T/test_structured.py::test_draw_first_decisions_agree_with_the_mask" \
  "$T/test_structured.py::test_constrained_sampling_is_the_chain_over_the_allowed_tokens[params0]" \
  -k "not gemma_k_tensor and not (head_reads and (gemma or qwen)) and not matches_the_reference_smollm and not test_kv_formula_equals_allocation_gemma and not scalar_and_simd_agree \
      and not avxvnni_evex and not (across_thread_counts and gemma) \
      and not (scalar and (cached_decode_equals_recompute or all_logits_equal_stepwise or across_thread_counts \
               or q8_0_cache_equals_recompute_past_a_chunk))" \
  || { banner "STAGE 2 (ASan + UBSan) FAILED"; exit 1; }
banner "stage 2 (ASan + UBSan) passed in $((SECONDS - start)) s"
