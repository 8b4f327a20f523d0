/*
 * A C host of the moe-rs C ABI, compiled and run by tests/c_program.rs.
 *
 * It opens a fixture checkpoint (argv[1]) through moe_layer_open_checkpoint, runs layer 0's
 * MoE block on the fixture's hidden states `x` from expected.safetensors three ways (bf16 with
 * the fixture's router logits, bf16 routed by the layer's own gate, f32 routed by the gate),
 * and checks each output against `out_vllm` within the fixtures README's tolerance,
 * 1e-2 * max|out_vllm|; routes once with moe_layer_route and runs the experts for that routing
 * with moe_layer_apply_topk on the whole layer and on the two ranks of an expert-parallel
 * group (moe_layer_open_checkpoint_ranked), whose outputs must sum to the whole layer's.
 * Then it feeds the API bad input (NULL and freed handles, a double free,
 * wrong sizes, an unknown dtype, a path that is not UTF-8) and checks the status codes.
 * Exit status 0 means every check passed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

static int failures = 0;

#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                      \
            fprintf(stderr, "\n");                             \
            failures++;                                        \
        }                                                      \
    } while (0)

/* Checks that `call` returned `want`, printing the library's message when not. */
static void expect_status(MoeStatus got, MoeStatus want, const char *what) {
    if (got != want) {
        fprintf(stderr, "FAILED %s: got %s, want %s (%s)\n", what,
                moe_status_name((uint32_t)got), moe_status_name((uint32_t)want),
                moe_last_error_message());
        failures++;
    } else if (want != MOE_STATUS_OK) {
        printf("  %-34s -> %s: %s\n", what, moe_status_name((uint32_t)got), moe_last_error_message());
    }
}

/* One tensor of a safetensors file: its dtype name, element count and bytes. */
typedef struct {
    char dtype[16];
    size_t elements;
    const unsigned char *data;
} Tensor;

/* The whole file in memory, and where its header and data start. */
typedef struct {
    unsigned char *bytes;
    size_t size;
    const char *header;
    size_t header_len;
    const unsigned char *data;
} Safetensors;

static int read_file(const char *path, Safetensors *st) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    st->bytes = malloc((size_t)size);
    st->size = (size_t)size;
    size_t got = fread(st->bytes, 1, st->size, f);
    fclose(f);
    if (got != st->size || st->size < 8) return 0;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | st->bytes[i];
    if (8 + n > st->size) return 0;
    st->header = (const char *)st->bytes + 8;
    st->header_len = (size_t)n;
    st->data = st->bytes + 8 + n;
    return 1;
}

/* Finds `key` after `from` and before `end`, returning the position after it. */
static const char *find_in(const char *from, const char *end, const char *key) {
    size_t k = strlen(key);
    for (const char *p = from; p + k <= end; p++)
        if (memcmp(p, key, k) == 0) return p + k;
    return NULL;
}

/* Looks a tensor up by name in the JSON header: tensor entries are the only keys followed by an
 * object (metadata values are strings). */
static int find_tensor(const Safetensors *st, const char *name, Tensor *t) {
    char key[128];
    snprintf(key, sizeof key, "\"%s\":{", name);
    const char *end = st->header + st->header_len;
    const char *obj = find_in(st->header, end, key);
    if (!obj) return 0;
    const char *close = find_in(obj, end, "}");
    if (!close) return 0;
    const char *dt = find_in(obj, close, "\"dtype\":\"");
    const char *offs = find_in(obj, close, "\"data_offsets\":[");
    if (!dt || !offs) return 0;
    size_t i = 0;
    while (dt[i] != '"' && i + 1 < sizeof t->dtype) { t->dtype[i] = dt[i]; i++; }
    t->dtype[i] = 0;
    char *next;
    unsigned long long begin = strtoull(offs, &next, 10);
    unsigned long long stop = strtoull(next + 1, NULL, 10);
    size_t width = strcmp(t->dtype, "F32") == 0 ? 4 : 2;
    t->elements = (size_t)(stop - begin) / width;
    t->data = st->data + begin;
    return 1;
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 tensor -> freshly allocated bf16 bits (the file's data may be unaligned). */
static uint16_t *bf16_bits(const Tensor *t) {
    uint16_t *v = malloc(t->elements * sizeof *v);
    for (size_t i = 0; i < t->elements; i++)
        v[i] = (uint16_t)(t->data[2 * i] | (t->data[2 * i + 1] << 8));
    return v;
}

/* Compares `got` with `want` within 1e-2 * max|want| (the fixtures README's W4A8 bound). */
static void compare(const char *what, const float *got, const float *want, size_t n) {
    float scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(want[i]));
    for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(got[i] - want[i]));
    printf("  %-34s max abs diff %.3e (tolerance %.3e)\n", what, worst, 1e-2 * scale);
    CHECK(scale > 0 && worst <= 1e-2f * scale, "%s: max abs diff %g > %g", what, worst, 1e-2 * scale);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    printf("moe-capi %s, fixture %s\n", moe_version(), argv[1]);
    char path[4096];
    snprintf(path, sizeof path, "%s/expected.safetensors", argv[1]);
    Safetensors st;
    Tensor tx, tl, tout;
    if (!read_file(path, &st) || !find_tensor(&st, "x", &tx) ||
        !find_tensor(&st, "router_logits", &tl) || !find_tensor(&st, "out_vllm", &tout)) {
        fprintf(stderr, "cannot read x, router_logits and out_vllm from %s\n", path);
        return 1;
    }
    CHECK(strcmp(tx.dtype, "BF16") == 0 && strcmp(tl.dtype, "BF16") == 0 &&
              strcmp(tout.dtype, "BF16") == 0,
          "expected bf16 tensors");

    MoeLayerHandle *layer = NULL;
    MoeStatus s = moe_layer_open_checkpoint(argv[1], MOE_FIRST_MOE_LAYER, 64, &layer);
    expect_status(s, MOE_STATUS_OK, "open the fixture");
    if (s != MOE_STATUS_OK) return 1;
    MoeLayerInfo info;
    expect_status(moe_layer_info(layer, &info), MOE_STATUS_OK, "info");
    MoeBackendInfo backend;
    expect_status(moe_layer_backend(layer, &backend), MOE_STATUS_OK, "backend");
    printf("  layer: E %zu, top-%zu, H %zu, I %zu, processed %d; backend %s, kernel %s, isa %s\n",
           info.num_experts, info.top_k, info.hidden, info.intermediate, (int)info.processed,
           backend.backend, backend.kernel, backend.isa);
    CHECK(info.processed, "the opened layer is processed");
    size_t n = tx.elements, h = info.hidden;
    CHECK(n % h == 0 && tl.elements == n / h * info.num_experts && tout.elements == n,
          "fixture sizes");

    uint16_t *x = bf16_bits(&tx), *logits = bf16_bits(&tl), *want_bits = bf16_bits(&tout);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    float *x32 = malloc(n * sizeof *x32), *out32 = malloc(n * sizeof *out32);
    uint16_t *out16 = malloc(n * sizeof *out16);
    for (size_t i = 0; i < n; i++) {
        want[i] = bf16_to_f32(want_bits[i]);
        x32[i] = bf16_to_f32(x[i]);
    }

    /* bf16, with the fixture's router logits. */
    s = moe_layer_apply(layer, MOE_DTYPE_BF16, x, n, logits, tl.elements, out16, n);
    expect_status(s, MOE_STATUS_OK, "apply bf16 with logits");
    for (size_t i = 0; i < n; i++) got[i] = bf16_to_f32(out16[i]);
    compare("bf16, fixture logits", got, want, n);

    /* bf16, routed by the layer's gate; sequential. */
    expect_status(moe_layer_set_num_threads(layer, 1), MOE_STATUS_OK, "sequential");
    s = moe_layer_apply(layer, MOE_DTYPE_BF16, x, n, NULL, 0, out16, n);
    expect_status(s, MOE_STATUS_OK, "apply bf16 routed by the gate");
    for (size_t i = 0; i < n; i++) got[i] = bf16_to_f32(out16[i]);
    compare("bf16, gate routing, 1 thread", got, want, n);

    /* f32, routed by the gate, on a private pool of 2 threads. */
    expect_status(moe_layer_set_num_threads(layer, 2), MOE_STATUS_OK, "private pool");
    s = moe_layer_apply(layer, MOE_DTYPE_F32, x32, n, NULL, 0, out32, n);
    expect_status(s, MOE_STATUS_OK, "apply f32 routed by the gate");
    compare("f32, gate routing, 2 threads", out32, want, n);

    /* Routing once, then the experts for that routing: on the whole layer, and on the two
       ranks of an expert-parallel group, whose outputs sum to the whole layer's. */
    size_t tokens = n / h, pairs = tokens * info.top_k;
    int32_t *ids = malloc(pairs * sizeof *ids);
    float *weights = malloc(pairs * sizeof *weights), *sum = calloc(n, sizeof *sum);
    expect_status(moe_layer_route(layer, MOE_DTYPE_BF16, logits, tl.elements, ids, weights, pairs),
                  MOE_STATUS_OK, "route");
    s = moe_layer_apply_topk(layer, MOE_DTYPE_F32, x32, n, ids, weights, pairs, out32, n);
    expect_status(s, MOE_STATUS_OK, "apply f32 with precomputed top-k");
    compare("f32, precomputed top-k", out32, want, n);
    for (size_t rank = 0; rank < 2; rank++) {
        MoeRanks ranks = {.tp_rank = 0, .tp_size = 1, .ep_rank = rank, .ep_size = 2};
        MoeLayerHandle *part = NULL;
        s = moe_layer_open_checkpoint_ranked(argv[1], MOE_FIRST_MOE_LAYER, 64, &ranks, &part);
        expect_status(s, MOE_STATUS_OK, "open an expert-parallel rank");
        if (s != MOE_STATUS_OK) break;
        float *part_out = malloc(n * sizeof *part_out);
        s = moe_layer_apply_topk(part, MOE_DTYPE_F32, x32, n, ids, weights, pairs, part_out, n);
        expect_status(s, MOE_STATUS_OK, "apply on an expert-parallel rank");
        for (size_t i = 0; i < n; i++) sum[i] += part_out[i];
        free(part_out);
        expect_status(moe_layer_free(part), MOE_STATUS_OK, "free a rank");
    }
    {
        float scale = 0, worst = 0;
        for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(out32[i]));
        for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(sum[i] - out32[i]));
        printf("  %-34s max abs diff %.3e (tolerance %.3e)\n", "ep=2 ranks summed vs one rank",
               worst, 1e-5 * scale);
        CHECK(scale > 0 && worst <= 1e-5f * scale, "ep=2 sum: max abs diff %g", worst);
    }
    /* Options: the defaults with int8 WNA16 activations, which a W4A8 checkpoint ignores, give
     * the same layer as the plain open; a struct_size smaller than the library's is refused. */
    {
        MoeLayerOptions opts;
        moe_layer_options_default(&opts);
        opts.wna16_activations = MOE_WNA16_ACTIVATIONS_INT8;
        MoeLayerHandle *same = NULL;
        s = moe_layer_open_checkpoint_with(argv[1], MOE_FIRST_MOE_LAYER, 64, NULL, &opts, &same);
        CHECK(s == MOE_STATUS_OK, "open with options: %s", moe_last_error_message());
        float *again = malloc(n * sizeof(float));
        CHECK(again != NULL, "out of memory");
        s = moe_layer_apply_topk(same, MOE_DTYPE_F32, x32, n, ids, weights, pairs, again, n);
        CHECK(s == MOE_STATUS_OK, "apply with options: %s", moe_last_error_message());
        CHECK(memcmp(again, out32, n * sizeof(float)) == 0, "options changed a W4A8 layer");
        printf("  %-34s identical\n", "open with default options");
        free(again);
        moe_layer_free(same);
        opts.struct_size = 4;
        expect_status(moe_layer_open_checkpoint_with(argv[1], MOE_FIRST_MOE_LAYER, 64, NULL,
                                                     &opts, &same),
                      MOE_STATUS_INVALID_ARGUMENT, "options of an unknown size");
    }
    MoeRanks bad_ranks = {.tp_rank = 0, .tp_size = 1, .ep_rank = 2, .ep_size = 2};
    MoeLayerHandle *none = NULL;
    expect_status(moe_layer_open_checkpoint_ranked(argv[1], MOE_FIRST_MOE_LAYER, 64, &bad_ranks,
                                                   &none),
                  MOE_STATUS_INVALID_ARGUMENT, "expert-parallel rank out of range");
    expect_status(moe_layer_apply_topk(layer, MOE_DTYPE_F32, x32, n, ids, weights, pairs - 1,
                                       out32, n),
                  MOE_STATUS_INVALID_ARGUMENT, "top-k of the wrong length");
    expect_status(moe_layer_route(layer, MOE_DTYPE_BF16, logits, tl.elements, ids, weights,
                                  pairs + 1),
                  MOE_STATUS_INVALID_ARGUMENT, "routing buffers of the wrong length");
    free(ids); free(weights); free(sum);

    /* Bad input: every case returns its status and leaves the process running. */
    printf("bad input:\n");
    expect_status(moe_layer_apply(NULL, MOE_DTYPE_F32, x32, n, NULL, 0, out32, n),
                  MOE_STATUS_NULL_POINTER, "NULL handle");
    expect_status(moe_layer_apply((MoeLayerHandle *)(uintptr_t)0x1234, MOE_DTYPE_F32, x32, n,
                                  NULL, 0, out32, n),
                  MOE_STATUS_INVALID_HANDLE, "made-up handle");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_F32, x32, n - 1, NULL, 0, out32, n - 1),
                  MOE_STATUS_INVALID_ARGUMENT, "hidden states not whole rows");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_F32, x32, n, NULL, 0, out32, n - h),
                  MOE_STATUS_INVALID_ARGUMENT, "output too short");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_BF16, x, n, logits, tl.elements - 1, out16, n),
                  MOE_STATUS_INVALID_ARGUMENT, "logits too short");
    expect_status(moe_layer_apply(layer, 77, x32, n, NULL, 0, out32, n),
                  MOE_STATUS_INVALID_ARGUMENT, "unknown dtype");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_F32, x32, n, NULL, 0, NULL, n),
                  MOE_STATUS_NULL_POINTER, "NULL output");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_F32, x32, n, NULL, 0, x32, n),
                  MOE_STATUS_INVALID_ARGUMENT, "output aliasing the input");
    size_t one_shape[1] = {1};
    int8_t one_code[1] = {0};
    expect_status(moe_layer_load_tensor(layer, "experts.0.w1.weight", MOE_DTYPE_I8, one_shape, 1,
                                        one_code, 1),
                  MOE_STATUS_BAD_STATE, "load after process");
    MoeLayerHandle *other = (MoeLayerHandle *)(uintptr_t)1;
    const char bad_utf8[] = {'/', 't', 'm', 'p', '/', (char)0xff, (char)0xfe, 0};
    expect_status(moe_layer_open_checkpoint(bad_utf8, 0, 16, &other), MOE_STATUS_INVALID_UTF8,
                  "path that is not UTF-8");
    CHECK(other == NULL, "a failed open clears *out");
    expect_status(moe_layer_open_checkpoint("/nonexistent/model", 0, 16, &other), MOE_STATUS_IO,
                  "missing model directory");
    expect_status(moe_layer_open_checkpoint(argv[1], 0, 16, NULL), MOE_STATUS_NULL_POINTER,
                  "NULL out-pointer");
    CHECK(strcmp(moe_status_name(12345), "MOE_STATUS_UNKNOWN") == 0, "unknown status name");

    expect_status(moe_layer_free(layer), MOE_STATUS_OK, "free");
    expect_status(moe_layer_free(layer), MOE_STATUS_INVALID_HANDLE, "double free");
    expect_status(moe_layer_apply(layer, MOE_DTYPE_F32, x32, n, NULL, 0, out32, n),
                  MOE_STATUS_INVALID_HANDLE, "apply after free");

    free(x); free(logits); free(want_bits); free(want); free(got); free(x32); free(out32);
    free(out16); free(st.bytes);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
