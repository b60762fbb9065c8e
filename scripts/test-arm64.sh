#!/usr/bin/env bash
# The ARM64 kernel tables proven without ARM hardware: tests/arm/check_kernels.c, cross-compiled
# with the core's kernel files (each ARM file with the -march pydecode/_build.py gives it), run
# under qemu-aarch64 as CPUs with and without the dot product and the int8 matrix multiply:
#   -cpu max          every feature: run-time selection must pick i8mm; all three tables checked
#   -cpu neoverse-n1  ARMv8.2 + dotprod, no i8mm (Graviton 2, Ampere Altra): dotprod
#   -cpu cortex-a76   ARMv8.2 + dotprod (a Raspberry Pi 5 / Snapdragon-class core): dotprod
#   -cpu cortex-a53   ARMv8.0, no dotprod: neon is picked, and dotprod and i8mm refuse to run
#   PYDECODE_ISA=neon|dotprod forces a lower table on a CPU that has more
# (qemu 7.2 has no named CPU model with i8mm but without SVE-era extras; `max` stands for the
# Apple M2+/Neoverse V1+ class.)
# Each run checks every table the CPU supports against the scalar table on every block format
# (bit-identical for the integer paths, stated tolerances for the float ones), and the repacked
# layouts' kernels against their plain-C twin. Then tests/arm/check_forward.c runs the whole
# forward pass through the C API (every core source, cross-compiled) on a tiny random model:
# prefill against the scalar table, cached decode against recomputing, a batch step against
# the same tokens prefilled alone, with and without repacking, under -cpu max (every table) and
# cortex-a53.
# (Not a whole aarch64 Python under qemu: Debian's arm64 python3 with numpy, cffi, tokenizers,
# sentencepiece and the test models under emulation would add many minutes of CI for these same
# C paths; the Python layers above them are not ISA-specific.)
#
# Needs gcc-aarch64-linux-gnu and qemu-user (Debian): installed with apt-get where missing and
# this user may (root, or sudo without a password). Exit 0 on success, 1 on a failure, 77 when the
# tools cannot be had (scripts/test.sh then says the ARM stage was skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
# The caller's table choice and sanitizer build are not this script's (qemu would inherit them).
unset PYDECODE_ISA PYDECODE_SANITIZE
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
if ! "${PYTHON:-python3}" -c 'import cffi' 2>/dev/null; then   # (pydecode/_build.py, read below, imports it)
  echo "test-arm64.sh: ${PYTHON:-python3} lacks cffi (set PYTHON to the project's virtualenv python)" >&2
  exit 77
fi
QEMU=${QEMU_AARCH64:-qemu-aarch64}

if ! command -v "$CC" >/dev/null || ! command -v "$QEMU" >/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  if command -v apt-get >/dev/null && $SUDO true 2>/dev/null; then
    echo "test-arm64.sh: installing gcc-aarch64-linux-gnu and qemu-user with apt-get" >&2
    if ! { $SUDO apt-get install -y -q --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null 2>&1 ||
           { $SUDO apt-get update -q >/dev/null 2>&1 &&
             $SUDO apt-get install -y -q --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null; }; }; then
      echo "test-arm64.sh: apt-get could not install the cross compiler and qemu" >&2
      exit 77
    fi
  fi
fi
if ! command -v "$CC" >/dev/null || ! command -v "$QEMU" >/dev/null; then
  echo "test-arm64.sh: $CC or $QEMU not found and not installable here" >&2
  exit 77
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/pydecode-arm64.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
# The flags and -march of each ARM file, read from the build's own table (one place).
read -r -a COMMON < <("${PYTHON:-python3}" - <<'EOF'
import runpy
b = runpy.run_path("pydecode/_build.py")
# (read on this x86 host: the ARM-only -ffp-contract=off the build adds on ARM64 is added here)
print(" ".join(f for f in b["COMMON_FLAGS"] if f != "-pthread") + " -ffp-contract=off")
EOF
)
mapfile -t ARMFILES < <("${PYTHON:-python3}" - <<'EOF'
import runpy
b = runpy.run_path("pydecode/_build.py")
for src, (flags, macro) in b["ARM_ISA_SOURCES"].items():
    print(src, macro, " ".join(flags))
EOF
)
DEFS=()
OBJS=()
for line in "${ARMFILES[@]}"; do
  read -r src macro flags <<<"$line"
  DEFS+=("-D$macro=1")
  obj="$OUT/$(basename "$src" .c).o"
  # shellcheck disable=SC2086
  "$CC" "${COMMON[@]}" $flags -Icsrc -c "$src" -o "$obj"
  OBJS+=("$obj")
done
# Every core source (the build's SOURCES list), then the two drivers.
mapfile -t CORE < <("${PYTHON:-python3}" -c 'import runpy; print("\n".join(runpy.run_path("pydecode/_build.py")["SOURCES"]))')
for src in "${CORE[@]}"; do
  obj="$OUT/$(echo "$src" | tr / _ | sed 's/\.c$//').o"
  "$CC" "${COMMON[@]}" "${DEFS[@]}" -Icsrc -c "$src" -o "$obj"
  OBJS+=("$obj")
done
for drv in check_kernels check_forward; do
  "$CC" "${COMMON[@]}" "${DEFS[@]}" -Icsrc -c "tests/arm/$drv.c" -o "$OUT/$drv.o"
  "$CC" -static -pthread -o "$OUT/$drv" "${OBJS[@]}" "$OUT/$drv.o" -lm
done
echo "test-arm64.sh: built $OUT/check_kernels and check_forward with $("$CC" -dumpfullversion 2>/dev/null || "$CC" -dumpversion)" >&2

fail=0
# run CPU EXPECTED [ENV...]: the table selection must print EXPECTED, and every check pass
run() {
  local cpu=$1 want=$2
  shift 2
  local log
  if ! log=$(env "$@" "$QEMU" -cpu "$cpu" "$OUT/check_kernels" 2>&1); then
    echo "$log"
    echo "test-arm64.sh: FAILED under -cpu $cpu $*" >&2
    fail=1
    return
  fi
  local got
  got=$(sed -n 's/^selected: //p' <<<"$log")
  if [ "$got" != "$want" ]; then
    echo "$log"
    echo "test-arm64.sh: -cpu $cpu $*: selected '$got', expected '$want'" >&2
    fail=1
    return
  fi
  printf 'test-arm64.sh: -cpu %-11s %-18s selected %-8s | %s\n' "$cpu" "$*" "$got" \
    "$(grep -E '^(neon|dotprod|i8mm):' <<<"$log" | tr '\n' ' ')"
}
# The forward pass on every table the CPU runs (tests/arm/check_forward.c): prefill against the
# scalar table, cached decode against recomputing, a batch step against each sequence alone.
forward() {
  local cpu=$1 log
  if ! log=$("$QEMU" -cpu "$cpu" "$OUT/check_forward" 2>&1); then
    echo "$log"
    echo "test-arm64.sh: forward pass FAILED under -cpu $cpu" >&2
    fail=1
    return
  fi
  printf 'test-arm64.sh: -cpu %-11s forward pass  | %s\n' "$cpu" "$(tail -1 <<<"$log")"
  sed 's/^/    /' <<<"$log" | grep -v '^    forward:' >&2 || true
}
run max i8mm
run neoverse-n1 dotprod
run cortex-a76 dotprod
run cortex-a53 neon
run max neon PYDECODE_ISA=neon
run max dotprod PYDECODE_ISA=dotprod
run cortex-a76 unsupported PYDECODE_ISA=i8mm
run cortex-a53 unsupported PYDECODE_ISA=dotprod
forward max
forward cortex-a53
[ "$fail" = 0 ] && echo "test-arm64.sh: every ARM kernel at every level agrees with its scalar twin" >&2
exit "$fail"
