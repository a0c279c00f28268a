// Golden driver for KleidiAI's F32 SME2 kernels llama.cpp routes F32 weights through (kernels.cpp's
// ggml_kleidiai_kernels_f32 SME2 entry; scripts/kleidiai-golden/make_f32p_golden.py builds and runs it): packs one
// case's inputs with the real KleidiAI packers, runs the MOPA GEMM (any m) and, when m == 1, the MLA GEMV on the same
// packed RHS, each unclamped and clamped, writes the buffers and prints one JSON line of what it ran.
//
//   kai_golden_f32p M N K LHS_F32 RHS_F32 BIAS_F32 CLAMP_MIN_BITS CLAMP_MAX_BITS GEMM_PREFIX GEMV_PREFIX
//
// LHS_F32: f32 [M][K]; RHS_F32: f32 [N][K] (the nxk packer's input, row stride 4K); BIAS_F32: f32 [N];
// CLAMP_*_BITS: the finite clamp as f32 bit patterns in hex. Writes GEMM_PREFIX.lhs_packed.bin, .rhs_packed.bin,
// .dst_f32.bin (clamp [-FLT_MAX, FLT_MAX]) and .dst_clamped_f32.bin, and for M == 1 GEMV_PREFIX.rhs_packed.bin,
// .dst_f32.bin and .dst_clamped_f32.bin. Packed buffers come from calloc; dst is filled with a NaN canary first and
// the driver counts the values the kernel left unwritten.
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/prctl.h>
#include <sys/prctl.h>

#include "kai/kai_common.h"
#include "kai_golden_io.h"
#include "kai/ukernels/matmul/matmul_clamp_f32_f32_f32p/kai_matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla.h"
#include "kai/ukernels/matmul/matmul_clamp_f32_f32p_f32p/kai_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa.h"
#include "kai/ukernels/matmul/pack/kai_lhs_pack_f32p2vlx1_f32_sme.h"
#include "kai/ukernels/matmul/pack/kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme.h"

#define GEMM(f) f##_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa
#define GEMV(f) f##_matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla

static void canary(float* dst, size_t count) {
    const uint32_t bits = 0x7fc0dead;
    for (size_t i = 0; i < count; i++) {
        memcpy(&dst[i], &bits, sizeof(bits));
    }
}

static size_t unwritten(const float* dst, size_t count) {
    const uint32_t bits = 0x7fc0dead;
    size_t left = 0;
    for (size_t i = 0; i < count; i++) {
        left += memcmp(&dst[i], &bits, sizeof(bits)) == 0;
    }
    return left;
}

int main(int argc, char** argv) {
    if (argc != 11) {
        fprintf(
            stderr, "usage: %s M N K LHS_F32 RHS_F32 BIAS_F32 CLAMP_MIN_BITS CLAMP_MAX_BITS GEMM_PREFIX GEMV_PREFIX\n",
            argv[0]);
        return 2;
    }
    const size_t m = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10), k = strtoul(argv[3], NULL, 10);
    const float* lhs = read_file(argv[4], m * k * sizeof(float));
    const float* rhs = read_file(argv[5], n * k * sizeof(float));
    const float* bias = read_file(argv[6], n * sizeof(float));
    const float lo = from_bits(argv[7]), hi = from_bits(argv[8]);
    const char *gemm_prefix = argv[9], *gemv_prefix = argv[10];

    const size_t mr = GEMM(kai_get_mr)(), nr = GEMM(kai_get_nr)(), kr = GEMM(kai_get_kr)(), sr = GEMM(kai_get_sr)();

    // One packing of the weights for both kernels (llama.cpp packs with the GEMM's nr, kr, sr).
    const size_t rhs_size = kai_get_rhs_packed_size_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme(n, k);
    void* rhs_packed = calloc(1, rhs_size);
    kai_run_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme(
        1, n, k, nr, kr, sr, k * sizeof(float), rhs, bias, NULL, rhs_packed, 0, NULL);

    const size_t lhs_size = kai_get_lhs_packed_size_lhs_pack_f32p2vlx1_f32_sme(m, k, mr, kr, sr);
    void* lhs_packed = calloc(1, lhs_size);
    kai_run_lhs_pack_f32p2vlx1_f32_sme(m, k, mr, kr, sr, 0, lhs, k * sizeof(float), lhs_packed);

    float* dst = malloc(m * n * sizeof(float));
    const float clamps[2][2] = {{-FLT_MAX, FLT_MAX}, {lo, hi}};
    const char* names[2] = {"dst_f32.bin", "dst_clamped_f32.bin"};
    size_t gemm_left[2], gemv_left[2] = {0, 0};
    for (int c = 0; c < 2; c++) {
        canary(dst, m * n);
        GEMM(kai_run)(m, n, k, lhs_packed, rhs_packed, dst, n * sizeof(float), sizeof(float), clamps[c][0], clamps[c][1]);
        gemm_left[c] = unwritten(dst, m * n);
        write_file(gemm_prefix, names[c], dst, m * n * sizeof(float));
    }
    write_file(gemm_prefix, "lhs_packed.bin", lhs_packed, lhs_size);
    write_file(gemm_prefix, "rhs_packed.bin", rhs_packed, rhs_size);
    if (m == 1) {
        for (int c = 0; c < 2; c++) {
            canary(dst, n);
            GEMV(kai_run)(1, n, k, lhs, k * sizeof(float), rhs_packed, dst, n * sizeof(float), sizeof(float),
                          clamps[c][0], clamps[c][1]);
            gemv_left[c] = unwritten(dst, n);
            write_file(gemv_prefix, names[c], dst, n * sizeof(float));
        }
        write_file(gemv_prefix, "rhs_packed.bin", rhs_packed, rhs_size);
    }

    printf(
        "{\"svl_bytes\": %zu, \"gemm\": {\"mr\": %zu, \"nr\": %zu, \"kr\": %zu, \"sr\": %zu, \"m_step\": %zu, "
        "\"n_step\": %zu, \"dst_unwritten\": %zu, \"dst_clamped_unwritten\": %zu}, "
        "\"gemv\": {\"nr\": %zu, \"kr\": %zu, \"sr\": %zu, \"m_step\": %zu, \"n_step\": %zu, \"dst_unwritten\": %zu, "
        "\"dst_clamped_unwritten\": %zu}, \"lhs_packed_bytes\": %zu, \"rhs_packed_bytes\": %zu}\n",
        (size_t)(prctl(PR_SME_GET_VL) & 0xffff), mr, nr, kr, sr, GEMM(kai_get_m_step)(), GEMM(kai_get_n_step)(),
        gemm_left[0], gemm_left[1], GEMV(kai_get_nr)(), GEMV(kai_get_kr)(), GEMV(kai_get_sr)(), GEMV(kai_get_m_step)(),
        GEMV(kai_get_n_step)(), gemv_left[0], gemv_left[1], lhs_size, rhs_size);
    return 0;
}
