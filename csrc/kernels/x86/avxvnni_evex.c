/* The AVX-VNNI table's source (x86/avxvnni.c) compiled a second time with its VEX dot products
 * (vpdpbusd / vpdpwssd, AVX-VNNI) mapped to the EVEX forms of AVX512-VNNI + VL, which compute
 * the same thing: a test-only table, "avxvnni_evex", so that the AVX-VNNI kernels' logic runs
 * on AVX-512 VNNI hosts without AVX-VNNI (AMD Zen 4; qemu's TCG has neither). Selected only by
 * name (PYDECODE_ISA, isa=), never as the best table; the real encoding runs where the CPU has
 * AVX-VNNI. */
#define PD_AVXVNNI_EVEX 1
#include "kernels/x86/avxvnni.c"
