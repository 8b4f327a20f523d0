// Times llama.cpp's MoE experts stage (ggml's MUL_MAT_ID) on the CPU backend, for
// `cargo xtask bench-peers`.
//
// One call is the graph llama.cpp builds for a MoE layer after routing (build_moe_ffn with a
// merged gate/up tensor): MUL_MAT_ID over gate/up (N = 2I, K = H), SwiGLU on the two halves,
// MUL_MAT_ID over down (N = H, K = I), the routing weights multiplied in, and the top-k outputs
// added per token. Routing (the gate matmul, softmax, top-k) is not part of it: the ids and
// weights are drawn in advance, uniformly, as `moe bench` does.
//
// The expert weights are quantized (Q4_0 or Q8_0) and, where the CPU backend offers it, put in
// its CPU_REPACK buffer, which is what llama.cpp does with a model's weights by default (Q4_0
// becomes Q4_0x8 on AVX2 and wider). Enough copies of the layer are made to cycle through at
// least --cycle-gib of distinct memory, one copy per call, so the weights come from DRAM as
// they do in a model with many layers.
//
// Output: one JSON object per line and per M on stdout (or in --out FILE, written as each M
// finishes, so a crash keeps the Ms before it); progress and errors on stderr.
//
//   llama_mul_mat_id --experts 128 --top-k 8 --hidden 2048 --inter 768 --m 1,16,256,1024
//                    [--type q4_0|q8_0] [--threads 2] [--iters 20] [--budget-s 20]
//                    [--cycle-gib 2] [--no-repack] [--out FILE]

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_M 64
#define MAX_COPIES 64
#define ROUTINGS 8
#define SRC_EXPERTS 2

static void die(const char *what) {
    fprintf(stderr, "llama_mul_mat_id: %s\n", what);
    exit(2);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// xorshift64*: reproducible and fast enough to fill hundreds of MB.
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static float rng_uniform(void) { // [0, 1)
    return (float)(rng_next() >> 40) / (float)(1u << 24);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Quantizes `experts` random matrices of rows x cols into dst, row block by row block.
static void quantize_random(enum ggml_type type, void *dst, int64_t experts, int64_t rows,
                            int64_t cols) {
    const int64_t block_rows = 64;
    float *f = malloc(sizeof(float) * block_rows * cols);
    if (!f) {
        die("out of memory for the float staging rows");
    }
    const size_t row_bytes = ggml_row_size(type, cols);
    for (int64_t r = 0; r < experts * rows; r += block_rows) {
        int64_t n = experts * rows - r < block_rows ? experts * rows - r : block_rows;
        for (int64_t i = 0; i < n * cols; i++) {
            f[i] = (rng_uniform() * 2.0f - 1.0f) * 0.05f;
        }
        ggml_quantize_chunk(type, f, (char *)dst + r * row_bytes, 0, n, cols, NULL);
    }
    free(f);
}

// Fills one [cols, rows, experts] weight tensor from the SRC_EXPERTS quantized source matrices
// (expert e gets source e % SRC_EXPERTS) through `staging`, so repacking sees a whole tensor.
static void set_weights(struct ggml_tensor *t, const char *src, char *staging) {
    const size_t per_expert = t->nb[2];
    for (int64_t e = 0; e < t->ne[2]; e++) {
        memcpy(staging + e * per_expert, src + (e % SRC_EXPERTS) * per_expert, per_expert);
    }
    ggml_backend_tensor_set(t, staging, 0, ggml_nbytes(t));
}

// Relative error (2-norm) of `got` ([tokens, H]) against a float reference computed from the
// dequantized source weights, the same inputs and routing: a graph that computed something
// else than the MoE layer (a wrong view, a wrong expert) would show here.
static double reference_rel_err(enum ggml_type type, int64_t K, int64_t H, int64_t I,
                                const char *src_gu, const char *src_down, const float *x,
                                const int32_t *ids, const float *rw, const float *got,
                                int tokens) {
    ggml_to_float_t to_float = ggml_get_type_traits(type)->to_float;
    const size_t gu_row = ggml_row_size(type, H), down_row = ggml_row_size(type, I);
    float *row = malloc(sizeof(float) * (H > I ? H : I));
    float *act = malloc(sizeof(float) * I);
    double *want = malloc(sizeof(double) * H);
    double err = 0.0, norm = 0.0;
    for (int t = 0; t < tokens; t++) {
        for (int64_t h = 0; h < H; h++) {
            want[h] = 0.0;
        }
        for (int64_t j = 0; j < K; j++) {
            const int64_t src = ids[t * K + j] % SRC_EXPERTS;
            const char *gu = src_gu + src * gu_row * 2 * I;
            const char *down = src_down + src * down_row * H;
            for (int64_t n = 0; n < I; n++) {
                double g = 0.0, u = 0.0;
                to_float(gu + n * gu_row, row, H);
                for (int64_t k = 0; k < H; k++) {
                    g += (double)row[k] * x[t * H + k];
                }
                to_float(gu + (I + n) * gu_row, row, H);
                for (int64_t k = 0; k < H; k++) {
                    u += (double)row[k] * x[t * H + k];
                }
                act[n] = (float)(g / (1.0 + exp(-g)) * u);
            }
            for (int64_t h = 0; h < H; h++) {
                double d = 0.0;
                to_float(down + h * down_row, row, I);
                for (int64_t k = 0; k < I; k++) {
                    d += (double)row[k] * act[k];
                }
                want[h] += rw[t * K + j] * d;
            }
        }
        for (int64_t h = 0; h < H; h++) {
            double diff = got[t * H + h] - want[h];
            err += diff * diff;
            norm += want[h] * want[h];
        }
    }
    free(row);
    free(act);
    free(want);
    return norm > 0.0 ? sqrt(err / norm) : INFINITY;
}

struct args {
    int64_t experts, top_k, hidden, inter;
    int m[MAX_M];
    int n_m;
    enum ggml_type type;
    int threads, iters;
    double budget_s, cycle_gib;
    int repack;
};

static void parse_args(int argc, char **argv, struct args *a) {
    memset(a, 0, sizeof(*a));
    a->type = GGML_TYPE_Q4_0;
    a->threads = 2;
    a->iters = 20;
    a->budget_s = 20.0;
    a->cycle_gib = 2.0;
    a->repack = 1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--no-repack")) {
            a->repack = 0;
            continue;
        }
        if (!v) {
            die("every option but --no-repack takes a value");
        }
        i++;
        if (!strcmp(k, "--experts")) {
            a->experts = atoll(v);
        } else if (!strcmp(k, "--top-k")) {
            a->top_k = atoll(v);
        } else if (!strcmp(k, "--hidden")) {
            a->hidden = atoll(v);
        } else if (!strcmp(k, "--inter")) {
            a->inter = atoll(v);
        } else if (!strcmp(k, "--threads")) {
            a->threads = atoi(v);
        } else if (!strcmp(k, "--iters")) {
            a->iters = atoi(v);
        } else if (!strcmp(k, "--budget-s")) {
            a->budget_s = atof(v);
        } else if (!strcmp(k, "--out")) {
            if (!freopen(v, "w", stdout)) {
                die("cannot open the --out file");
            }
        } else if (!strcmp(k, "--cycle-gib")) {
            a->cycle_gib = atof(v);
        } else if (!strcmp(k, "--type")) {
            if (!strcmp(v, "q4_0")) {
                a->type = GGML_TYPE_Q4_0;
            } else if (!strcmp(v, "q8_0")) {
                a->type = GGML_TYPE_Q8_0;
            } else {
                die("--type is q4_0 or q8_0");
            }
        } else if (!strcmp(k, "--m")) {
            for (const char *p = v; *p && a->n_m < MAX_M;) {
                char *end;
                long m = strtol(p, &end, 10);
                if (end == p || m <= 0) {
                    die("--m wants a comma-separated list of positive counts");
                }
                a->m[a->n_m++] = (int)m;
                p = *end == ',' ? end + 1 : end;
            }
        } else {
            fprintf(stderr, "llama_mul_mat_id: unknown option %s\n", k);
            exit(2);
        }
    }
    if (a->experts <= 0 || a->top_k <= 0 || a->top_k > a->experts || a->hidden <= 0 ||
        a->inter <= 0 || a->n_m == 0 || a->threads <= 0 || a->iters <= 0) {
        die("need --experts, --top-k (<= experts), --hidden, --inter and --m");
    }
    if (a->hidden % 32 || a->inter % 32) {
        die("--hidden and --inter must be multiples of 32 (the quantization block)");
    }
}

// The CPU backend's repacking buffer type, if it has one.
static ggml_backend_buffer_type_t repack_buft(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) {
        return NULL;
    }
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) {
            return *b;
        }
    }
    return NULL;
}

// One layer copy's graph for M tokens: the experts stage llama.cpp builds after routing.
static struct ggml_tensor *experts_stage(struct ggml_context *ctx, struct ggml_tensor *w_gu,
                                         struct ggml_tensor *w_down, struct ggml_tensor *x,
                                         struct ggml_tensor *ids, struct ggml_tensor *rw) {
    const int64_t h = x->ne[0], m = x->ne[1], k = ids->ne[0];
    struct ggml_tensor *xb = ggml_reshape_3d(ctx, x, h, 1, m);
    struct ggml_tensor *gu = ggml_mul_mat_id(ctx, w_gu, xb, ids); // [2I, k, M]
    const int64_t inter = gu->ne[0] / 2;
    struct ggml_tensor *gate = ggml_view_3d(ctx, gu, inter, k, m, gu->nb[1], gu->nb[2], 0);
    struct ggml_tensor *up =
        ggml_view_3d(ctx, gu, inter, k, m, gu->nb[1], gu->nb[2], inter * gu->nb[0]);
    struct ggml_tensor *act = ggml_swiglu_split(ctx, gate, up);  // [I, k, M]
    struct ggml_tensor *d = ggml_mul_mat_id(ctx, w_down, act, ids); // [H, k, M]
    d = ggml_mul(ctx, d, rw);
    struct ggml_tensor *out = ggml_view_2d(ctx, d, h, m, d->nb[2], 0);
    for (int64_t i = 1; i < k; i++) {
        out = ggml_add(ctx, out, ggml_view_2d(ctx, d, h, m, d->nb[2], i * d->nb[1]));
    }
    return out;
}

int main(int argc, char **argv) {
    struct args a;
    parse_args(argc, argv, &a);
    const int64_t E = a.experts, K = a.top_k, H = a.hidden, I = a.inter;

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) {
        die("ggml_backend_cpu_init failed");
    }
    ggml_backend_cpu_set_n_threads(backend, a.threads);
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);

    // Layer copies: enough to cycle through cycle_gib of weights, at least two.
    const size_t layer_bytes = (size_t)E * (ggml_row_size(a.type, H) * 2 * I +
                                            ggml_row_size(a.type, I) * H);
    int copies = (int)ceil(a.cycle_gib * 1073741824.0 / (double)layer_bytes);
    copies = copies < 2 ? 2 : copies > MAX_COPIES ? MAX_COPIES : copies;

    struct ggml_init_params wp = {ggml_tensor_overhead() * (2 * MAX_COPIES + 8), NULL, true};
    struct ggml_context *wctx = ggml_init(wp);
    struct ggml_tensor *w_gu[MAX_COPIES], *w_down[MAX_COPIES];
    for (int c = 0; c < copies; c++) {
        w_gu[c] = ggml_new_tensor_3d(wctx, a.type, H, 2 * I, E);
        w_down[c] = ggml_new_tensor_3d(wctx, a.type, I, H, E);
    }

    // Inputs, sized for the largest M; each M's graph views its first M tokens.
    int max_m = 0;
    for (int i = 0; i < a.n_m; i++) {
        max_m = a.m[i] > max_m ? a.m[i] : max_m;
    }
    struct ggml_init_params ip = {ggml_tensor_overhead() * (2 * ROUTINGS + 4), NULL, true};
    struct ggml_context *ictx = ggml_init(ip);
    struct ggml_tensor *x_all = ggml_new_tensor_2d(ictx, GGML_TYPE_F32, H, max_m);
    struct ggml_tensor *ids_all[ROUTINGS], *rw_all[ROUTINGS];
    for (int r = 0; r < ROUTINGS; r++) {
        ids_all[r] = ggml_new_tensor_2d(ictx, GGML_TYPE_I32, K, max_m);
        rw_all[r] = ggml_new_tensor_3d(ictx, GGML_TYPE_F32, 1, K, max_m);
    }
    ggml_backend_buffer_t ibuf = ggml_backend_alloc_ctx_tensors(ictx, backend);
    if (!ibuf) {
        die("cannot allocate the inputs");
    }

    // Weights: the repacking buffer where the backend supports MUL_MAT_ID on it for this type.
    const char *layout = "plain";
    ggml_backend_buffer_t wbuf = NULL;
    ggml_backend_buffer_type_t rbuft = a.repack ? repack_buft(backend) : NULL;
    if (rbuft) {
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, rbuft);
        if (wbuf) {
            struct ggml_init_params pp = {ggml_tensor_overhead() * 8, NULL, true};
            struct ggml_context *pctx = ggml_init(pp);
            struct ggml_tensor *xb = ggml_reshape_3d(pctx, x_all, H, 1, max_m);
            struct ggml_tensor *probe[2] = {
                ggml_mul_mat_id(pctx, w_gu[0], xb, ids_all[0]),
                ggml_mul_mat_id(pctx, w_down[0],
                                ggml_new_tensor_3d(pctx, GGML_TYPE_F32, I, K, max_m),
                                ids_all[0]),
            };
            int ok = ggml_backend_dev_supports_op(dev, probe[0]) &&
                     ggml_backend_dev_supports_op(dev, probe[1]);
            ggml_free(pctx);
            if (ok) {
                layout = "CPU_REPACK";
            } else {
                ggml_backend_buffer_free(wbuf);
                wbuf = NULL;
                for (int c = 0; c < copies; c++) {
                    w_gu[c]->buffer = w_down[c]->buffer = NULL;
                    w_gu[c]->data = w_down[c]->data = NULL;
                    w_gu[c]->extra = w_down[c]->extra = NULL;
                }
            }
        }
    }
    if (!wbuf) {
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, ggml_backend_cpu_buffer_type());
    }
    if (!wbuf) {
        die("cannot allocate the expert weights");
    }
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    double t0 = now_s();
    fprintf(stderr,
            "llama_mul_mat_id: ggml %s (%s), %s %s, E=%lld top_k=%lld H=%lld I=%lld, %d threads, "
            "%d layer copies (%.2f GiB)\n",
            ggml_version(), ggml_commit(), ggml_type_name(a.type), layout, (long long)E,
            (long long)K, (long long)H, (long long)I, a.threads, copies,
            (double)layer_bytes * copies / 1073741824.0);
    const size_t gu_expert = w_gu[0]->nb[2], down_expert = w_down[0]->nb[2];
    char *src_gu = malloc(gu_expert * SRC_EXPERTS);
    char *src_down = malloc(down_expert * SRC_EXPERTS);
    {
        size_t staging_bytes = ggml_nbytes(w_gu[0]) > ggml_nbytes(w_down[0])
                                   ? ggml_nbytes(w_gu[0])
                                   : ggml_nbytes(w_down[0]);
        char *staging = malloc(staging_bytes);
        if (!src_gu || !src_down || !staging) {
            die("out of memory for the weight staging buffers");
        }
        quantize_random(a.type, src_gu, SRC_EXPERTS, 2 * I, H);
        quantize_random(a.type, src_down, SRC_EXPERTS, H, I);
        for (int c = 0; c < copies; c++) {
            set_weights(w_gu[c], src_gu, staging);
            set_weights(w_down[c], src_down, staging);
        }
        free(staging);
    }
    fprintf(stderr, "llama_mul_mat_id: weights ready in %.1f s\n", now_s() - t0);

    // Host copies of the inputs, for the reference check.
    float *x_host = malloc(sizeof(float) * H * max_m);
    int32_t *ids_host = malloc(sizeof(int32_t) * K * max_m * ROUTINGS);
    float *rw_host = malloc(sizeof(float) * K * max_m * ROUTINGS);
    {
        float *x = x_host;
        int *perm = malloc(sizeof(int) * E);
        for (int64_t i = 0; i < H * max_m; i++) {
            x[i] = rng_uniform() * 2.0f - 1.0f;
        }
        ggml_backend_tensor_set(x_all, x, 0, ggml_nbytes(x_all));
        for (int r = 0; r < ROUTINGS; r++) {
            int32_t *ids = ids_host + r * K * max_m;
            float *rw = rw_host + r * K * max_m;
            for (int t = 0; t < max_m; t++) {
                // k distinct experts, uniformly: a partial Fisher-Yates shuffle.
                for (int e = 0; e < E; e++) {
                    perm[e] = e;
                }
                float sum = 0.0f;
                for (int j = 0; j < K; j++) {
                    int pick = j + (int)(rng_next() % (uint64_t)(E - j));
                    int tmp = perm[j];
                    perm[j] = perm[pick];
                    perm[pick] = tmp;
                    ids[t * K + j] = perm[j];
                    rw[t * K + j] = 0.5f + rng_uniform();
                    sum += rw[t * K + j];
                }
                for (int j = 0; j < K; j++) {
                    rw[t * K + j] /= sum;
                }
            }
            ggml_backend_tensor_set(ids_all[r], ids, 0, ggml_nbytes(ids_all[r]));
            ggml_backend_tensor_set(rw_all[r], rw, 0, ggml_nbytes(rw_all[r]));
        }
        free(perm);
    }

    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    const size_t graph_nodes = 64 + 4 * (size_t)K;
    for (int mi = 0; mi < a.n_m; mi++) {
        const int M = a.m[mi];
        // Graphs: one per (copy, routing) pair used, built once.
        const int n_graphs = copies * 2 < ROUTINGS ? ROUTINGS : copies * 2;
        size_t meta = ggml_tensor_overhead() * (size_t)n_graphs * graph_nodes +
                      ggml_graph_overhead_custom(graph_nodes, false) * (size_t)n_graphs;
        struct ggml_init_params gp = {meta, NULL, true};
        struct ggml_context *gctx = ggml_init(gp);
        struct ggml_cgraph **graphs = malloc(sizeof(*graphs) * n_graphs);
        struct ggml_tensor **outs = malloc(sizeof(*outs) * n_graphs);
        for (int g = 0; g < n_graphs; g++) {
            const int c = g % copies, r = g % ROUTINGS;
            struct ggml_tensor *x = ggml_view_2d(gctx, x_all, H, M, x_all->nb[1], 0);
            struct ggml_tensor *ids = ggml_view_2d(gctx, ids_all[r], K, M, ids_all[r]->nb[1], 0);
            struct ggml_tensor *rw = ggml_view_3d(gctx, rw_all[r], 1, K, M, rw_all[r]->nb[1],
                                                  rw_all[r]->nb[2], 0);
            graphs[g] = ggml_new_graph_custom(gctx, graph_nodes, false);
            outs[g] = experts_stage(gctx, w_gu[c], w_down[c], x, ids, rw);
            ggml_set_output(outs[g]);
            ggml_build_forward_expand(graphs[g], outs[g]);
        }

        double *times = malloc(sizeof(double) * (a.iters + 1));
        int calls = 0, status_ok = 1;
        double warm = 0.0, started = now_s();
        // One warm-up call, then timed calls until --iters or the time budget (3 at least).
        for (int i = -1; i < a.iters; i++) {
            const int g = (i + 1) % n_graphs;
            if (!ggml_gallocr_alloc_graph(galloc, graphs[g])) {
                die("cannot allocate the graph");
            }
            double t = now_s();
            if (ggml_backend_graph_compute(backend, graphs[g]) != GGML_STATUS_SUCCESS) {
                status_ok = 0;
                break;
            }
            t = now_s() - t;
            if (i < 0) {
                warm = t;
                // Calls too slow for three inside the budget are skipped, not measured once.
                if (t * 3 > a.budget_s * 2) {
                    break;
                }
                continue;
            }
            times[calls++] = t;
            if (calls >= 3 && now_s() - started > a.budget_s) {
                break;
            }
        }
        int finite = 1;
        double rel_err = NAN;
        if (status_ok && calls > 0) {
            const int g = calls % n_graphs;
            struct ggml_tensor *o = outs[g];
            float *host = malloc(ggml_nbytes(o));
            ggml_gallocr_alloc_graph(galloc, graphs[g]);
            ggml_backend_graph_compute(backend, graphs[g]);
            // The output is a view of d: read the rows of the final add.
            for (int64_t t = 0; t < M; t++) {
                ggml_backend_tensor_get(o, host + t * H, t * o->nb[1], H * sizeof(float));
            }
            for (int64_t i = 0; i < H * M; i++) {
                if (!isfinite(host[i])) {
                    finite = 0;
                    break;
                }
            }
            const int r = g % ROUTINGS;
            rel_err = reference_rel_err(a.type, K, H, I, src_gu, src_down, x_host,
                                        ids_host + r * K * max_m, rw_host + r * K * max_m, host,
                                        M < 2 ? M : 2);
            free(host);
        }
        printf("{\"peer\": \"llama.cpp\", \"ggml_version\": \"%s\", \"ggml_commit\": \"%s\", "
               "\"type\": \"%s\", \"layout\": \"%s\", \"E\": %lld, \"top_k\": %lld, \"H\": %lld, "
               "\"I\": %lld, \"M\": %d, \"threads\": %d, \"copies\": %d, \"weight_bytes\": %zu, ",
               ggml_version(), ggml_commit(), ggml_type_name(a.type), layout, (long long)E,
               (long long)K, (long long)H, (long long)I, M, a.threads, copies,
               layer_bytes * copies);
        if (!status_ok) {
            printf("\"status\": \"failed\", \"reason\": \"graph compute failed\"}\n");
        } else if (calls == 0) {
            printf("\"status\": \"skipped\", \"reason\": \"one call took %.1f s\"}\n", warm);
        } else if (!finite) {
            printf("\"status\": \"failed\", \"reason\": \"non-finite output\"}\n");
        } else {
            qsort(times, calls, sizeof(double), cmp_double);
            double med = calls % 2 ? times[calls / 2]
                                   : 0.5 * (times[calls / 2 - 1] + times[calls / 2]);
            printf("\"status\": \"ok\", \"calls\": %d, \"ms_median\": %.4f, \"ms_min\": %.4f, "
                   "\"ms_max\": %.4f, \"check_rel_err\": %.5f}\n",
                   calls, med * 1e3, times[0] * 1e3, times[calls - 1] * 1e3, rel_err);
            fprintf(stderr,
                    "llama_mul_mat_id: M=%d %.3f ms (min %.3f, %d calls), rel_err vs f64 "
                    "reference %.4f\n",
                    M, med * 1e3, times[0] * 1e3, calls, rel_err);
        }
        fflush(stdout);
        free(times);
        free(graphs);
        free(outs);
        ggml_free(gctx);
    }

    free(src_gu);
    free(src_down);
    free(x_host);
    free(ids_host);
    free(rw_host);
    ggml_gallocr_free(galloc);
    ggml_backend_buffer_free(wbuf);
    ggml_backend_buffer_free(ibuf);
    ggml_free(wctx);
    ggml_free(ictx);
    ggml_backend_free(backend);
    return 0;
}
