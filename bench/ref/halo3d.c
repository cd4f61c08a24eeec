/*
 * halo3d: the C twin of amgo's examples/halo3d, for timing against C MPI
 * libraries (Open MPI, MPICH): Jacobi sweeps of the 7-point stencil on an
 * N x N x N grid over a non-periodic Cartesian process grid from
 * MPI_Dims_create, the six faces exchanged each sweep with
 * MPI_Neighbor_alltoallw and MPI_Type_create_subarray datatypes, the same
 * initial values, boundary and arithmetic as the Go program.
 *
 *   mpirun -np 2 halo3d -s 32,64,128 -i 50
 *
 * Output, as examples/halo3d -bench: "# Size", "Time per sweep (us)",
 * "Exchange (us)" (including waiting for a neighbour still sweeping) and
 * "Exchange only (us)" (an MPI_Barrier, untimed, before each of as many
 * exchanges as sweeps, run before the sweeps), the slowest rank's means,
 * one row per grid edge.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOUNDARY 1.0

static void span(int n, int k, int i, int *lo, int *hi) {
    int q = n / k, r = n % k;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

static void run(MPI_Comm world, int n, int sweeps, int np, int *dims, double *slowest) {
    int periods[3] = {0, 0, 0}, coords[3], l[3], o[3], me;
    MPI_Comm cart;
    dims[0] = dims[1] = dims[2] = 0;
    MPI_Dims_create(np, 3, dims);
    MPI_Cart_create(world, 3, dims, periods, 0, &cart);
    MPI_Comm_rank(cart, &me);
    MPI_Cart_coords(cart, me, 3, coords);
    for (int d = 0; d < 3; d++) {
        int lo, hi;
        span(n, dims[d], coords[d], &lo, &hi);
        l[d] = hi - lo;
        o[d] = lo;
    }
    int sz[3] = {l[0] + 2, l[1] + 2, l[2] + 2};
    size_t total = (size_t)sz[0] * sz[1] * sz[2];
    double *u = malloc(total * sizeof(double)), *v = malloc(total * sizeof(double));
    for (size_t i = 0; i < total; i++) u[i] = v[i] = BOUNDARY;
#define AT(i, j, k) (((size_t)(i) * sz[1] + (j)) * sz[2] + (k))
    for (int i = 1; i <= l[0]; i++)
        for (int j = 1; j <= l[1]; j++)
            for (int k = 1; k <= l[2]; k++)
                u[AT(i, j, k)] = (double)((7 * (o[0] + i - 1) + 13 * (o[1] + j - 1) + 17 * (o[2] + k - 1)) % 101) / 100;
    MPI_Datatype send[6], recv[6];
    int counts[6];
    MPI_Aint adispls[6];
    for (int d = 0; d < 3; d++) {
        for (int side = 0; side < 2; side++) {
            int sub[3] = {l[0], l[1], l[2]}, from[3] = {1, 1, 1}, to[3] = {1, 1, 1};
            sub[d] = 1;
            from[d] = side == 0 ? 1 : l[d];
            to[d] = side == 0 ? 0 : l[d] + 1;
            MPI_Type_create_subarray(3, sz, sub, from, MPI_ORDER_C, MPI_DOUBLE, &send[2 * d + side]);
            MPI_Type_create_subarray(3, sz, sub, to, MPI_ORDER_C, MPI_DOUBLE, &recv[2 * d + side]);
            MPI_Type_commit(&send[2 * d + side]);
            MPI_Type_commit(&recv[2 * d + side]);
        }
    }
    for (int f = 0; f < 6; f++) {
        counts[f] = 1;
        adispls[f] = 0;
    }
    int si = sz[1] * sz[2], sj = sz[2];
    double at = 0;
    for (int s = 0; s < sweeps; s++) {
        MPI_Barrier(cart);
        double x0 = MPI_Wtime();
        MPI_Neighbor_alltoallw(u, counts, adispls, send, u, counts, adispls, recv, cart);
        at += MPI_Wtime() - x0;
    }
    MPI_Barrier(cart);
    double t0 = MPI_Wtime(), xt = 0;
    for (int s = 0; s < sweeps; s++) {
        double x0 = MPI_Wtime();
        MPI_Neighbor_alltoallw(u, counts, adispls, send, u, counts, adispls, recv, cart);
        xt += MPI_Wtime() - x0;
        for (int i = 1; i <= l[0]; i++)
            for (int j = 1; j <= l[1]; j++) {
                size_t p = AT(i, j, 1);
                for (int k = 0; k < l[2]; k++) {
                    size_t q = p + k;
                    v[q] = (u[q - si] + u[q + si] + u[q - sj] + u[q + sj] + u[q - 1] + u[q + 1]) / 6;
                }
            }
        double *t = u;
        u = v;
        v = t;
    }
    double per = 1e6 / (sweeps > 0 ? sweeps : 1);
    double el[3] = {(MPI_Wtime() - t0) * per, xt * per, at * per};
    MPI_Reduce(el, slowest, 3, MPI_DOUBLE, MPI_MAX, 0, cart);
    for (int f = 0; f < 6; f++) {
        MPI_Type_free(&send[f]);
        MPI_Type_free(&recv[f]);
    }
    free(u);
    free(v);
    MPI_Comm_free(&cart);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, np, c, sweeps = 20;
    char sizes[256] = "48";
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    while ((c = getopt(argc, argv, "s:i:")) != -1) {
        switch (c) {
        case 's': snprintf(sizes, sizeof sizes, "%s", optarg); break;
        case 'i': sweeps = atoi(optarg); break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    const char *lib;
#if defined(OPEN_MPI)
    lib = "Open MPI";
#elif defined(MPICH)
    lib = "MPICH";
#else
    lib = "MPI";
#endif
    int first = 1;
    for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok), dims[3];
        double t[3];
        run(MPI_COMM_WORLD, n, sweeps, np, dims, t);
        if (me == 0) {
            if (first) {
                printf("# amgo reference: %s halo3d: %d ranks (%d x %d x %d), Neighbor_alltoallw, %d sweeps\n", lib, np, dims[0], dims[1], dims[2], sweeps);
                printf("%-*s%*s%*s%*s\n", 10, "# Size", 20, "Time per sweep (us)", 20, "Exchange (us)", 20, "Exchange only (us)");
            }
            printf("%-*d%*.2f%*.2f%*.2f\n", 10, n, 20, t[0], 20, t[1], 20, t[2]);
            fflush(stdout);
        }
        first = 0;
    }
    MPI_Finalize();
    return 0;
}
