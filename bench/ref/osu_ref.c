/*
 * osu_ref: OSU-like point-to-point reference benchmarks for C MPI libraries
 * (Open MPI, MPICH), with the same method, sizes, iteration counts, options and
 * output layout as amgo's `osu` command (bench/osu), so that the harness can lay
 * them side by side. Written for amgo; it follows the method the OSU
 * Micro-Benchmarks document (https://mvapich.cse.ohio-state.edu/benchmarks/),
 * not OSU's code.
 *
 *   mpirun -np 2 osu_ref latency [-m min:max] [-i iters] [-x warmup] [-d vector]
 *   mpirun -np 2 osu_ref bw      [-m min:max] [-i iters] [-x warmup] [-W window]
 *   mpirun -np 2 osu_ref bibw    [-m min:max] [-i iters] [-x warmup] [-W window]
 *   mpirun -np N osu_ref allreduce|bcast|alltoall|barrier [-m min:max] [-i iters] [-x warmup]
 *   mpirun -np N osu_ref iallreduce|ialltoall|ibcast|ibarrier [-m min:max] [-i iters] [-x warmup]
 *
 * Nonblocking collectives (as osu_iallreduce etc.): per size, each rank times
 * the operation started and waited for at once (pure communication, t), then
 * started, followed by t of busy computation without MPI calls, then waited
 * for; rows average over the ranks Overall(us), Compute(us), Pure Comm.(us)
 * and Overlap(%) = max(0, 100 - (overall - compute) / t * 100).
 *
 * Collectives (as osu_allreduce etc. and amgo's `osu` collectives): sizes
 * 1 B..1 MiB (allreduce: 4 B.., float elements), 1000 iterations (100 warm-up)
 * up to 8 KiB, 100 (10) above; each rank times its calls, the row is the
 * average over the ranks of the mean time per call.
 *
 *   mpirun -np 2 osu_ref put_latency|get_latency|put_bw|get_bw|acc_latency|fop_latency|cas_latency
 *                        [-m min:max] [-i iters] [-x warmup] [-W window] [-w create|allocate] [-s flush|lock|fence|pscw]
 *
 * One-sided tests (as amgo's `osu put_latency` etc., bench/osu/rma.go): rank
 * 0 the origin, rank 1 the target; flush: one shared lock, each operation
 * (or window of them) followed by MPI_Win_flush; lock: each inside its own
 * lock/unlock; fence: rank 0 operates, both fence, then rank 1 (latency:
 * half the round); pscw: post/start/complete/wait, then the other way
 * (latency: half). acc_latency accumulates MPI_INT with MPI_SUM;
 * fop_latency and cas_latency one int64.
 *
 * Defaults (OSU 7.2): latency 0..4 MiB, 10000 iterations (100 warm-up) up to
 * 8 KiB, 1000 (10) above; bw/bibw 1..4 MiB, window 64, 100 (10) up to 8 KiB,
 * 20 (2) above. -i and -x set one count for every size. Separate send and
 * receive buffers; all receives of a window share one buffer, as in OSU.
 * latency -d vector sends each message as one MPI_Type_vector(size/8, 1, 2,
 * MPI_DOUBLE): every other double of a buffer twice the size, as amgo's
 * `osu latency -d vector`.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LARGE 8192
#define MAXSIZE (1 << 22)

static int min_size = -1, max_size = MAXSIZE, iters = -1, warm = -1, window = 64;

static void counts(int lat, int size, int *n, int *w) {
    if (lat) {
        *n = size > LARGE ? 1000 : 10000;
        *w = size > LARGE ? 10 : 100;
    } else {
        *n = size > LARGE ? 20 : 100;
        *w = size > LARGE ? 2 : 10;
    }
    if (iters > 0) *n = iters;
    if (warm >= 0) *w = warm;
}

static void header(const char *title, const char *col) {
    printf("# amgo reference: %s\n", title);
    printf("%-*s%*s\n", 10, "# Size", 20, col);
    fflush(stdout);
}

static void row(int size, double v) {
    printf("%-*d%*.*f\n", 10, size, 20, 2, v);
    fflush(stdout);
}

/* row2 is row with two figures (mbw_mr's MB/s and messages/s). */
static void row2(int size, double a, double b) {
    printf("%-*d%*.*f%*.*f\n", 10, size, 20, 2, a, 20, 2, b);
    fflush(stdout);
}

/* libname names the MPI library this program was built with. */
static const char *libname(void) {
#if defined(OPEN_MPI)
    return "Open MPI";
#elif defined(MPICH)
    return "MPICH";
#else
    return "MPI";
#endif
}

static int is_coll(const char *t) {
    return !strcmp(t, "allreduce") || !strcmp(t, "bcast") || !strcmp(t, "alltoall") || !strcmp(t, "barrier") ||
           !strcmp(t, "iallreduce") || !strcmp(t, "ialltoall") || !strcmp(t, "ibcast") || !strcmp(t, "ibarrier");
}

/* nbc_start starts nonblocking collective test on size bytes. */
static void nbc_start(const char *test, char *sbuf, char *rbuf, int size, MPI_Request *req) {
    if (!strcmp(test, "iallreduce")) MPI_Iallreduce(sbuf, rbuf, size / 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
    else if (!strcmp(test, "ialltoall")) MPI_Ialltoall(sbuf, size, MPI_CHAR, rbuf, size, MPI_CHAR, MPI_COMM_WORLD, req);
    else if (!strcmp(test, "ibarrier")) MPI_Ibarrier(MPI_COMM_WORLD, req);
    else MPI_Ibcast(sbuf, size, MPI_CHAR, 0, MPI_COMM_WORLD, req);
}

/* nbc_row times one size of a nonblocking collective and prints its row. */
static void nbc_row(const char *test, char *sbuf, char *rbuf, int size, int n, int w, int me, int np) {
    double pure = 0, overall = 0, busy = 0;
    for (int pass = 0; pass < 2; pass++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double target = pure / n;
        for (int i = 0; i < n + w; i++) {
            MPI_Request req;
            double t0 = MPI_Wtime(), c = 0;
            nbc_start(test, sbuf, rbuf, size, &req);
            if (pass == 1) {
                double c0 = MPI_Wtime();
                while (MPI_Wtime() - c0 < target) {
                }
                c = MPI_Wtime() - c0;
            }
            MPI_Wait(&req, MPI_STATUS_IGNORE);
            if (i < w) continue;
            if (pass == 0) pure += MPI_Wtime() - t0;
            else {
                overall += MPI_Wtime() - t0;
                busy += c;
            }
        }
    }
    double mine[3] = {overall * 1e6 / n, busy * 1e6 / n, pure * 1e6 / n}, sum[3];
    MPI_Reduce(mine, sum, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (me == 0) {
        for (int i = 0; i < 3; i++) sum[i] /= np;
        double overlap = sum[2] > 0 ? 100 - (sum[0] - sum[1]) / sum[2] * 100 : 0;
        if (overlap < 0) overlap = 0;
        printf("%-*d%*.2f%*.2f%*.2f%*.2f\n", 10, size, 20, sum[0], 20, sum[1], 20, sum[2], 20, overlap);
        fflush(stdout);
    }
}

static int collective(int argc, char **argv, const char *test, int me, int np) {
    int c;
    int lo = -1, hi = 1 << 20;
    optind = 2;
    while ((c = getopt(argc, argv, "m:i:x:")) != -1) {
        switch (c) {
        case 'm':
            if (strchr(optarg, ':')) sscanf(optarg, "%d:%d", &lo, &hi);
            else { lo = 1; hi = atoi(optarg); }
            break;
        case 'i': iters = atoi(optarg); break;
        case 'x': warm = atoi(optarg); break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int nbc = test[0] == 'i';
    int allreduce = !strcmp(test + nbc, "allreduce"), bcast = !strcmp(test, "bcast"), barrier = !strcmp(test + nbc, "barrier");
    if (lo < 0) lo = allreduce ? 4 : 1;
    char *sbuf = malloc((size_t)hi * np + 4), *rbuf = malloc((size_t)hi * np + 4);
    memset(sbuf, 's', (size_t)hi * np + 4);
    memset(rbuf, 'r', (size_t)hi * np + 4);
    const char *lib = libname();
    if (me == 0) {
        printf("# amgo reference: %s %s Latency Test\n", lib, test);
        if (nbc)
            printf("%-*s%*s%*s%*s%*s\n", 10, "# Size", 20, "Overall(us)", 20, "Compute(us)", 20, "Pure Comm.(us)", 20, "Overlap(%)"); /* ibarrier: one row, size 0 */
        else
            printf("%-*s%*s\n", 10, "# Size", 20, "Avg Latency(us)"); /* barrier: one row, size 0 */
        fflush(stdout);
    }
    for (int size = barrier ? 0 : lo; size <= (barrier ? 0 : hi); size *= 2) {
        if (allreduce && size < 4) { if (size == 0) break; continue; }
        int n = size > LARGE ? 100 : 1000, w = size > LARGE ? 10 : 100;
        if (iters > 0) n = iters;
        if (warm >= 0) w = warm;
        if (nbc) {
            nbc_row(test, sbuf, rbuf, size, n, w, me, np);
            if (barrier) break;
            continue;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double total = 0;
        for (int i = 0; i < n + w; i++) {
            double t0 = MPI_Wtime();
            if (allreduce) MPI_Allreduce(sbuf, rbuf, size / 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (bcast) MPI_Bcast(sbuf, size, MPI_CHAR, 0, MPI_COMM_WORLD);
            else if (barrier) MPI_Barrier(MPI_COMM_WORLD);
            else MPI_Alltoall(sbuf, size, MPI_CHAR, rbuf, size, MPI_CHAR, MPI_COMM_WORLD);
            if (i >= w) total += MPI_Wtime() - t0;
        }
        double mine = total * 1e6 / n, sum = 0;
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (me == 0) {
            printf("%-*d%*.*f\n", 10, size, 20, 2, sum / np);
            fflush(stdout);
        }
        if (barrier) break;
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}

/* One-sided communication. */
static MPI_Win rwin;
static MPI_Group rpeer;
static char *rsrc, *rdst;

/* The operands and result of the fetch operations: valid until the flush
 * or synchronization that completes them, so not on the stack. */
static long long one = 1, zero = 0, old;

static void rma_op(const char *test, int size, int k, int peer) {
    MPI_Aint disp = (MPI_Aint)k * size;
    if (!strncmp(test, "put", 3)) MPI_Put(rsrc + disp, size, MPI_CHAR, peer, disp, size, MPI_CHAR, rwin);
    else if (!strncmp(test, "get", 3)) MPI_Get(rdst + disp, size, MPI_CHAR, peer, disp, size, MPI_CHAR, rwin);
    else if (!strcmp(test, "acc_latency")) MPI_Accumulate(rsrc, size / 4, MPI_INT, peer, 0, size / 4, MPI_INT, MPI_SUM, rwin);
    else if (!strcmp(test, "fop_latency")) MPI_Fetch_and_op(&one, &old, MPI_LONG_LONG, peer, 0, MPI_SUM, rwin);
    else MPI_Compare_and_swap(&one, &zero, &old, MPI_LONG_LONG, peer, 0, rwin);
}

static int rma(int argc, char **argv, const char *test, int me) {
    int lat = strstr(test, "_bw") == NULL, c, create = 0;
    const char *sync = "flush";
    int lo = 1, hi = MAXSIZE;
    if (!strcmp(test, "acc_latency")) lo = 4;
    if (!strcmp(test, "fop_latency") || !strcmp(test, "cas_latency")) lo = hi = 8;
    optind = 2;
    while ((c = getopt(argc, argv, "m:i:x:W:w:s:")) != -1) {
        switch (c) {
        case 'm': sscanf(optarg, "%d:%d", &lo, &hi); break;
        case 'i': iters = atoi(optarg); break;
        case 'x': warm = atoi(optarg); break;
        case 'W': window = atoi(optarg); break;
        case 'w': create = !strcmp(optarg, "create"); break;
        case 's': sync = optarg; break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, me / 2 ? 1 : 0, me, &pair);
    int ops = lat ? 1 : window;
    size_t n = (size_t)(hi > 8 ? hi : 8) * ops;
    rsrc = malloc(n);
    rdst = malloc(n);
    memset(rsrc, 'a', n);
    char *base = NULL;
    if (me < 2) {
        if (create) {
            base = malloc(n);
            MPI_Win_create(base, n, 1, MPI_INFO_NULL, pair, &rwin);
        } else {
            MPI_Win_allocate(n, 1, MPI_INFO_NULL, pair, &base, &rwin);
        }
        MPI_Group g;
        MPI_Win_get_group(rwin, &g);
        int other = 1 - me;
        MPI_Group_incl(g, 1, &other, &rpeer);
        MPI_Group_free(&g);
    }
    const char *lib = libname();
    char title[160];
    snprintf(title, sizeof title, "%s MPI_%s Test (window %s, synchronization %s)", lib, test, create ? "create" : "allocate", sync);
    if (me == 0) header(title, lat ? "Latency (us)" : "Bandwidth (MB/s)");
    for (int size = lo; size <= hi && me < 2; size *= 2) {
        int nn, w;
        counts(lat, size, &nn, &w);
        MPI_Barrier(pair);
        double t0 = 0;
        int peer = 1 - me;
        if (!strcmp(sync, "flush") || !strcmp(sync, "lock")) {
            if (me == 0) {
                int flush = !strcmp(sync, "flush");
                if (flush) MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, rwin);
                for (int i = 0; i < nn + w; i++) {
                    if (i == w) t0 = MPI_Wtime();
                    if (!flush) MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, rwin);
                    for (int k = 0; k < ops; k++) rma_op(test, size, k, 1);
                    if (flush) MPI_Win_flush(1, rwin);
                    else MPI_Win_unlock(1, rwin);
                }
                if (flush) MPI_Win_unlock(1, rwin);
            }
        } else if (!strcmp(sync, "fence")) {
            MPI_Win_fence(0, rwin);
            for (int i = 0; i < nn + w; i++) {
                if (i == w) t0 = MPI_Wtime();
                for (int turn = 0; turn < (lat ? 2 : 1); turn++) {
                    if (me == turn)
                        for (int k = 0; k < ops; k++) rma_op(test, size, k, peer);
                    MPI_Win_fence(0, rwin);
                }
            }
            MPI_Win_fence(MPI_MODE_NOSUCCEED, rwin);
        } else {
            for (int i = 0; i < nn + w; i++) {
                if (i == w) t0 = MPI_Wtime();
                for (int turn = 0; turn < (lat ? 2 : 1); turn++) {
                    if (me == turn) {
                        MPI_Win_start(rpeer, 0, rwin);
                        for (int k = 0; k < ops; k++) rma_op(test, size, k, peer);
                        MPI_Win_complete(rwin);
                    } else {
                        MPI_Win_post(rpeer, 0, rwin);
                        MPI_Win_wait(rwin);
                    }
                }
            }
        }
        double el = MPI_Wtime() - t0;
        MPI_Barrier(pair);
        if (me == 0) {
            double half = lat && (!strcmp(sync, "fence") || !strcmp(sync, "pscw")) ? 2.0 : 1.0;
            if (lat) row(size, el * 1e6 / (nn * half));
            else row(size, (double)size * ops * nn / el / 1e6);
        }
    }
    if (me < 2) {
        MPI_Group_free(&rpeer);
        MPI_Win_free(&rwin);
        if (create) free(base);
    }
    free(rsrc);
    free(rdst);
    MPI_Comm_free(&pair);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (argc < 2 || np < 2) {
        if (me == 0) fprintf(stderr, "usage: mpirun -np 2 osu_ref latency|bw|bibw|mbw_mr [-m min:max] [-i n] [-x n] [-W n]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *test = argv[1];
    int lat = strcmp(test, "latency") == 0, bw = strcmp(test, "bw") == 0, bibw = strcmp(test, "bibw") == 0;
    /* mbw_mr (osu_mbw_mr): np/2 pairs (i, i + np/2), each streaming as bw
       does; the row is every pair's bytes over the slowest sender's time,
       and the messages per second that makes. */
    int mbw = strcmp(test, "mbw_mr") == 0;
    if (mbw) {
        if (np % 2 != 0) {
            if (me == 0) fprintf(stderr, "osu_ref: mbw_mr needs an even number of ranks\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        bw = 1;
    }
    int pairs = mbw ? np / 2 : 1;
    if (!lat && !bw && !bibw && is_coll(test)) {
        return collective(argc, argv, test, me, np);
    }
    if (strstr(test, "put_") || strstr(test, "get_") || strstr(test, "acc_") || strstr(test, "fop_") || strstr(test, "cas_")) {
        return rma(argc, argv, test, me);
    }
    if (!lat && !bw && !bibw) {
        if (me == 0) fprintf(stderr, "osu_ref: unknown test %s\n", test);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int c, vector = 0;
    optind = 2;
    while ((c = getopt(argc, argv, "m:i:x:W:d:")) != -1) {
        switch (c) {
        case 'm':
            if (strchr(optarg, ':')) sscanf(optarg, "%d:%d", &min_size, &max_size);
            else { min_size = 0; max_size = atoi(optarg); }
            break;
        case 'i': iters = atoi(optarg); break;
        case 'x': warm = atoi(optarg); break;
        case 'W': window = atoi(optarg); break;
        case 'd':
            if (strcmp(optarg, "vector") != 0 || !lat) MPI_Abort(MPI_COMM_WORLD, 2);
            vector = 1;
            break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (min_size < 0) min_size = lat ? 0 : 1;
    if (vector && min_size < 8) min_size = 8;
    double *sv = vector ? calloc(2 * (size_t)max_size / 8 + 2, sizeof(double)) : NULL;
    double *rv = vector ? calloc(2 * (size_t)max_size / 8 + 2, sizeof(double)) : NULL;
    char *sbuf = malloc(max_size + 1), *rbuf = malloc(max_size + 1);
    memset(sbuf, 's', max_size + 1);
    memset(rbuf, 'r', max_size + 1);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * window);
    char ack[4];
    const char *lib = libname();
    char title[128];
    snprintf(title, sizeof title, "%s %s%s", lib,
             lat ? "Latency Test" : mbw ? "Multiple Bandwidth / Message Rate Test" : bw ? "Bandwidth Test" : "Bi-Directional Bandwidth Test",
             vector ? " (vector datatype)" : "");
    if (me == 0 && mbw) {
        printf("# amgo reference: %s\n# [ pairs: %d ] [ window size: %d ]\n", title, pairs, window);
        printf("%-*s%*s%*s\n", 10, "# Size", 20, "MB/s", 20, "Messages/s");
        fflush(stdout);
    } else if (me == 0) header(title, lat ? "Latency (us)" : "Bandwidth (MB/s)");
    int sender = me < pairs;
    int peer = mbw ? (sender ? me + pairs : me - pairs) : 1 - me;
    for (int size = min_size; size <= max_size; size = size ? size * 2 : 1) {
        int n, w;
        counts(lat, size, &n, &w);
        MPI_Datatype vec = MPI_DATATYPE_NULL;
        if (vector) {
            MPI_Type_vector(size / 8, 1, 2, MPI_DOUBLE, &vec);
            MPI_Type_commit(&vec);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = 0;
        if (me < 2 * pairs) {
            for (int i = 0; i < n + w; i++) {
                if (i == w) t0 = MPI_Wtime();
                if (lat && vector) {
                    if (me == 0) {
                        MPI_Send(sv, 1, vec, 1, 1, MPI_COMM_WORLD);
                        MPI_Recv(rv, 1, vec, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(rv, 1, vec, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(sv, 1, vec, 0, 1, MPI_COMM_WORLD);
                    }
                } else if (lat) {
                    if (me == 0) {
                        MPI_Send(sbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                        MPI_Recv(rbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(rbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(sbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                    }
                } else if (bw) {
                    if (sender) {
                        for (int j = 0; j < window; j++) MPI_Isend(sbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[j]);
                        MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
                        MPI_Recv(ack, 4, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        for (int j = 0; j < window; j++) MPI_Irecv(rbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[j]);
                        MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
                        MPI_Send(ack, 4, MPI_CHAR, peer, 2, MPI_COMM_WORLD);
                    }
                } else {
                    for (int j = 0; j < window; j++) MPI_Irecv(rbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[j]);
                    for (int j = 0; j < window; j++) MPI_Isend(sbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[window + j]);
                    MPI_Waitall(2 * window, reqs, MPI_STATUSES_IGNORE);
                }
            }
        }
        if (mbw) {
            double el = sender ? MPI_Wtime() - t0 : 0, slowest = 0;
            MPI_Reduce(&el, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            double mbs = (double)pairs * size * (double)n * window / slowest / 1e6;
            if (me == 0) row2(size, mbs, mbs * 1e6 / (size ? size : 1));
        } else if (me == 0) {
            double el = MPI_Wtime() - t0;
            if (lat) row(size, el * 1e6 / (2.0 * n));
            else row(size, (bibw ? 2.0 : 1.0) * size * (double)n * window / el / 1e6);
        }
        if (vector) MPI_Type_free(&vec);
        if (size == 0 && max_size == 0) break;
    }
    free(sv);
    free(rv);
    MPI_Barrier(MPI_COMM_WORLD);
    free(sbuf);
    free(rbuf);
    free(reqs);
    MPI_Finalize();
    return 0;
}
