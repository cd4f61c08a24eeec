/*
 * osu_ref: OSU-like point-to-point reference benchmarks for C MPI libraries
 * (Open MPI, MPICH), with the same method, sizes, iteration counts, options and
 * output layout as amgo's `osu` command (bench/osu), so that the harness can lay
 * them side by side. Written for amgo; it follows the method described in
 * reference/peers.md §7.2, not OSU's code.
 *
 *   mpirun -np 2 osu_ref latency [-m min:max] [-i iters] [-x warmup]
 *   mpirun -np 2 osu_ref bw      [-m min:max] [-i iters] [-x warmup] [-W window]
 *   mpirun -np 2 osu_ref bibw    [-m min:max] [-i iters] [-x warmup] [-W window]
 *
 * Defaults (OSU 7.2): latency 0..4 MiB, 10000 iterations (100 warm-up) up to
 * 8 KiB, 1000 (10) above; bw/bibw 1..4 MiB, window 64, 100 (10) up to 8 KiB,
 * 20 (2) above. -i and -x set one count for every size. Separate send and
 * receive buffers; all receives of a window share one buffer, as in OSU.
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

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (argc < 2 || np < 2) {
        if (me == 0) fprintf(stderr, "usage: mpirun -np 2 osu_ref latency|bw|bibw [-m min:max] [-i n] [-x n] [-W n]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *test = argv[1];
    int lat = strcmp(test, "latency") == 0, bw = strcmp(test, "bw") == 0, bibw = strcmp(test, "bibw") == 0;
    if (!lat && !bw && !bibw) {
        if (me == 0) fprintf(stderr, "osu_ref: unknown test %s\n", test);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int c;
    optind = 2;
    while ((c = getopt(argc, argv, "m:i:x:W:")) != -1) {
        switch (c) {
        case 'm':
            if (strchr(optarg, ':')) sscanf(optarg, "%d:%d", &min_size, &max_size);
            else { min_size = 0; max_size = atoi(optarg); }
            break;
        case 'i': iters = atoi(optarg); break;
        case 'x': warm = atoi(optarg); break;
        case 'W': window = atoi(optarg); break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (min_size < 0) min_size = lat ? 0 : 1;
    char *sbuf = malloc(max_size + 1), *rbuf = malloc(max_size + 1);
    memset(sbuf, 's', max_size + 1);
    memset(rbuf, 'r', max_size + 1);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * window);
    char ack[4];
    const char *lib;
#if defined(OPEN_MPI)
    lib = "Open MPI";
#elif defined(MPICH)
    lib = "MPICH";
#else
    lib = "MPI";
#endif
    char title[128];
    snprintf(title, sizeof title, "%s %s", lib, lat ? "Latency Test" : bw ? "Bandwidth Test" : "Bi-Directional Bandwidth Test");
    if (me == 0) header(title, lat ? "Latency (us)" : "Bandwidth (MB/s)");
    int peer = 1 - me;
    for (int size = min_size; size <= max_size; size = size ? size * 2 : 1) {
        int n, w;
        counts(lat, size, &n, &w);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = 0;
        if (me < 2) {
            for (int i = 0; i < n + w; i++) {
                if (i == w) t0 = MPI_Wtime();
                if (lat) {
                    if (me == 0) {
                        MPI_Send(sbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                        MPI_Recv(rbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(rbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(sbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                    }
                } else if (bw) {
                    if (me == 0) {
                        for (int j = 0; j < window; j++) MPI_Isend(sbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &reqs[j]);
                        MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
                        MPI_Recv(ack, 4, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else {
                        for (int j = 0; j < window; j++) MPI_Irecv(rbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &reqs[j]);
                        MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
                        MPI_Send(ack, 4, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
                    }
                } else {
                    for (int j = 0; j < window; j++) MPI_Irecv(rbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[j]);
                    for (int j = 0; j < window; j++) MPI_Isend(sbuf, size, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &reqs[window + j]);
                    MPI_Waitall(2 * window, reqs, MPI_STATUSES_IGNORE);
                }
            }
        }
        if (me == 0) {
            double el = MPI_Wtime() - t0;
            if (lat) row(size, el * 1e6 / (2.0 * n));
            else row(size, (bibw ? 2.0 : 1.0) * size * (double)n * window / el / 1e6);
        }
        if (size == 0 && max_size == 0) break;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(sbuf);
    free(rbuf);
    free(reqs);
    MPI_Finalize();
    return 0;
}
