/* scale.c: the program of bench/scale in C, for Open MPI and MPICH beside
 * amgo: a ring MPI_Sendrecv and an MPI_Allreduce (the README's program), then
 * each rank's peak resident memory (VmHWM), gathered at rank 0 and printed in
 * bench/scale's format. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long peak_rss(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "VmHWM:", 6) == 0)
			kb = strtol(line + 6, NULL, 10);
	fclose(f);
	return kb * 1024;
}

int main(int argc, char **argv)
{
	double start, out, in, sum;
	int me, n;
	long hwm, *all = NULL;

	MPI_Init(&argc, &argv);
	start = MPI_Wtime();
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	out = me;
	MPI_Sendrecv(&out, 1, MPI_DOUBLE, (me + 1) % n, 0, &in, 1, MPI_DOUBLE, (me + n - 1) % n, 0,
		     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	MPI_Allreduce(&in, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	if (sum != (double)n * (n - 1) / 2) {
		fprintf(stderr, "scale: sum of ranks %g\n", sum);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	hwm = peak_rss();
	if (me == 0)
		all = malloc(sizeof(long) * n);
	MPI_Gather(&hwm, 1, MPI_LONG, all, 1, MPI_LONG, 0, MPI_COMM_WORLD);
	if (me == 0) {
		long s = 0, hi = 0;
		for (int i = 0; i < n; i++) {
			s += all[i];
			if (all[i] > hi)
				hi = all[i];
		}
		printf("scale: ranks %d processes %d peak-rss-per-rank-MB avg %.1f max %.1f total-MB %.0f wall-s %.2f\n", n, n,
		       (double)s / n / 1e6, (double)hi / 1e6, (double)s / 1e6, MPI_Wtime() - start);
	}
	MPI_Finalize();
	return 0;
}
