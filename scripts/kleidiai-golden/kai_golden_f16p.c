// Golden driver for KleidiAI's matmul_clamp_f32_f16p_qsi4c32p family (scripts/kleidiai-golden/make_f16p_golden.py
// builds and runs it): packs one case's inputs with the real KleidiAI packers, runs the real matmul kernel
// unclamped and clamped, writes the buffers and prints one JSON line of what it ran.
//
//   kai_golden_f16p M N K BL LHS_F32 RHS_Q4_0 CLAMP_MIN_BITS CLAMP_MAX_BITS OUT_PREFIX
//
// LHS_F32: f32 [M][K]; RHS_Q4_0: GGML block_q4_0 [N][K/32] (the packer's qsu4c32s16s0 input, verbatim);
// CLAMP_*_BITS: the finite clamp as f32 bit patterns in hex. Writes OUT_PREFIX.lhs_packed.bin, .rhs_packed.bin,
// .dst_f32.bin (clamp [-FLT_MAX, FLT_MAX]) and .dst_clamped_f32.bin. Packed buffers come from calloc; dst is filled
// with a NaN canary first and the driver counts the values the kernel left unwritten.
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/prctl.h>
#include <sys/prctl.h>

#include "kai/kai_common.h"
#include "kai_golden_io.h"
#include "kai/ukernels/matmul/matmul_clamp_f32_f16p_qsi4c32p/kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa.h"
#include "kai/ukernels/matmul/pack/kai_lhs_pack_f16pmrx2_f32_neon.h"
#include "kai/ukernels/matmul/pack/kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon.h"

#define KERNEL(f) f##_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa

static size_t run_matmul(
    size_t m, size_t n, size_t k, size_t bl, const void* lhs_packed, const void* rhs_packed, float* dst, float lo,
    float hi) {
    const uint32_t canary = 0x7fc0dead;
    for (size_t i = 0; i < m * n; i++) {
        memcpy(&dst[i], &canary, sizeof(canary));
    }
    KERNEL(kai_run)(m, n, k, bl, lhs_packed, rhs_packed, dst, n * sizeof(float), sizeof(float), lo, hi);
    size_t unwritten = 0;
    for (size_t i = 0; i < m * n; i++) {
        unwritten += memcmp(&dst[i], &canary, sizeof(canary)) == 0;
    }
    return unwritten;
}

int main(int argc, char** argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s M N K BL LHS_F32 RHS_Q4_0 CLAMP_MIN_BITS CLAMP_MAX_BITS OUT_PREFIX\n", argv[0]);
        return 2;
    }
    const size_t m = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10), k = strtoul(argv[3], NULL, 10);
    const size_t bl = strtoul(argv[4], NULL, 10);
    const float* lhs = read_file(argv[5], m * k * sizeof(float));
    const uint8_t* rhs = read_file(argv[6], n * (k / 32) * 18);
    const float lo = from_bits(argv[7]), hi = from_bits(argv[8]);
    const char* prefix = argv[9];

    const size_t mr = KERNEL(kai_get_mr)(), nr = KERNEL(kai_get_nr)();
    const size_t kr = KERNEL(kai_get_kr)(), sr = KERNEL(kai_get_sr)();

    const size_t lhs_size = kai_get_lhs_packed_size_lhs_pack_f16pmrx2_f32_neon(m, k, bl, mr, kr, sr);
    void* lhs_packed = calloc(1, lhs_size);
    kai_run_lhs_pack_f16pmrx2_f32_neon(m, k, bl, mr, kr, sr, 0, lhs, k * sizeof(float), lhs_packed);

    const size_t rhs_size = kai_get_rhs_packed_size_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon(n, k, nr, kr, bl);
    void* rhs_packed = calloc(1, rhs_size);
    const struct kai_rhs_pack_qs4cxs1s0_param params = {.lhs_zero_point = 1, .rhs_zero_point = 8};
    kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon(
        1, n, k, nr, kr, sr, bl, rhs, NULL, rhs_packed, 0, &params);

    float* dst = malloc(m * n * sizeof(float));
    const size_t unwritten = run_matmul(m, n, k, bl, lhs_packed, rhs_packed, dst, -FLT_MAX, FLT_MAX);
    write_file(prefix, "dst_f32.bin", dst, m * n * sizeof(float));
    const size_t unwritten_clamped = run_matmul(m, n, k, bl, lhs_packed, rhs_packed, dst, lo, hi);
    write_file(prefix, "dst_clamped_f32.bin", dst, m * n * sizeof(float));
    write_file(prefix, "lhs_packed.bin", lhs_packed, lhs_size);
    write_file(prefix, "rhs_packed.bin", rhs_packed, rhs_size);

    printf(
        "{\"svl_bytes\": %zu, \"mr\": %zu, \"nr\": %zu, \"kr\": %zu, \"sr\": %zu, \"m_step\": %zu, \"n_step\": %zu, "
        "\"lhs_packed_bytes\": %zu, \"rhs_packed_bytes\": %zu, \"dst_unwritten\": %zu, "
        "\"dst_clamped_unwritten\": %zu}\n",
        (size_t)(prctl(PR_SME_GET_VL) & 0xffff), mr, nr, kr, sr, KERNEL(kai_get_m_step)(), KERNEL(kai_get_n_step)(),
        lhs_size, rhs_size, unwritten, unwritten_clamped);
    return 0;
}
