// The golden drivers' file and argument helpers (kai_golden_f16p.c, kai_golden_f32p.c): read a whole input file,
// write an output file named PREFIX.SUFFIX, read an f32 from its bit pattern in hex.
#ifndef KAI_GOLDEN_IO_H
#define KAI_GOLDEN_IO_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* read_file(const char* path, size_t size) {
    FILE* f = fopen(path, "rb");
    void* buf = malloc(size);
    if (f == NULL || buf == NULL || fread(buf, 1, size, f) != size) {
        fprintf(stderr, "cannot read %zu bytes of %s\n", size, path);
        exit(2);
    }
    fclose(f);
    return buf;
}

static void write_file(const char* prefix, const char* suffix, const void* buf, size_t size) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.%s", prefix, suffix);
    FILE* f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, size, f) != size) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static float from_bits(const char* hex) {
    uint32_t bits = (uint32_t)strtoul(hex, NULL, 16);
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

#endif  // KAI_GOLDEN_IO_H
