/* MPI job of the chaos tests: rank 0 and the last rank (on different
 * sites) ping-pong a checked 64 KiB message every 20 ms for the number of
 * seconds given (0: one exchange). Rank 0 prints "chaos_mpi running" after
 * the first exchange and "chaos_mpi ok N" (N exchanges) at the end when
 * every payload came back intact. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 65536 };

static void fill(char *b, long it) {
    for (int i = 4; i < N; i++) b[i] = (char)(i * 31 + it * 7 + 5);
}

int main(int argc, char **argv) {
    int rank, size, bad = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double dur = argc > 1 ? atof(argv[1]) : 0, t0 = MPI_Wtime();
    int last = size - 1;
    char *buf = malloc(N), *ref = malloc(N);
    long it = 0;
    for (;;) {
        int go = 0;
        fill(ref, it);
        if (rank == 0) {
            go = MPI_Wtime() - t0 < dur;
            memcpy(ref, &go, sizeof go);
            MPI_Send(ref, N, MPI_CHAR, last, 1, MPI_COMM_WORLD);
            memset(buf, 0, N);
            MPI_Recv(buf, N, MPI_CHAR, last, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (memcmp(buf, ref, N)) bad++;
            if (it == 0) {
                printf("chaos_mpi running\n");
                fflush(stdout);
            }
        } else if (rank == last) {
            MPI_Recv(buf, N, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            memcpy(&go, buf, sizeof go);
            memcpy(ref, &go, sizeof go);
            if (memcmp(buf, ref, N)) bad++;
            MPI_Send(buf, N, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
        }
        it++;
        if (size > 2) MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!go) break;
        usleep(20000);
    }
    int allbad = 0;
    MPI_Reduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (allbad) printf("chaos_mpi FAILED %d bad of %ld\n", allbad, it);
        else printf("chaos_mpi ok %ld\n", it);
        fflush(stdout);
    }
    MPI_Finalize();
    return allbad != 0;
}
