/* MPI job for the shim end-to-end test: a ping-pong between the first and the
 * last rank (on different sites) and an all-to-all across every rank, both
 * with checked payloads. Prints "shim_mpi ok" from rank 0 when all passed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char val(int from, int to, int i) { return (char)(from * 131 + to * 17 + i * 7 + 3); }

int main(int argc, char **argv) {
    int rank, size, bad = 0;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);

    /* ping-pong rank 0 <-> rank size-1 */
    static const int sizes[] = {1, 1024, 65536, 1 << 20};
    char *buf = malloc(1 << 20), *ref = malloc(1 << 20);
    for (int i = 0; i < (1 << 20); i++) ref[i] = (char)(i * 31 + 7);
    int last = size - 1;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        for (int it = 0; it < 5; it++) {
            if (rank == 0) {
                MPI_Send(ref, n, MPI_CHAR, last, 1, MPI_COMM_WORLD);
                memset(buf, 0, n);
                MPI_Recv(buf, n, MPI_CHAR, last, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (memcmp(buf, ref, n)) bad++;
            } else if (rank == last) {
                MPI_Recv(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, n, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
            }
        }
    }

    /* all-to-all, 64 KiB per pair */
    const int blk = 65536;
    char *sb = malloc((size_t)blk * size), *rb = malloc((size_t)blk * size);
    for (int to = 0; to < size; to++)
        for (int i = 0; i < blk; i++) sb[(size_t)to * blk + i] = val(rank, to, i);
    MPI_Alltoall(sb, blk, MPI_CHAR, rb, blk, MPI_CHAR, MPI_COMM_WORLD);
    for (int from = 0; from < size; from++)
        for (int i = 0; i < blk; i++)
            if (rb[(size_t)from * blk + i] != val(from, rank, i)) { bad++; break; }

    int allbad = 0;
    MPI_Reduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf(allbad ? "shim_mpi FAILED %d\n" : "shim_mpi ok\n", allbad);
    MPI_Finalize();
    return allbad ? 1 : 0;
}
