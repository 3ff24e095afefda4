#pragma once
// Opens the transport between the ranks of a run spread over machines (core/transport.h has the
// interface): MPI's when the process was started by `mpirun` as one of several ranks, else a
// single rank's. Plus the checks every rank makes together before loading.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/transport.h"

namespace tandem {

struct TransportOptions {
  double timeout_s = 60;  // the longest any call waits for a peer
};

// The transport of this process: MPI's when tandem was built with MPI and runs under mpirun with
// more than one rank (MPI is initialized here, once per process), else a single rank's.
std::unique_ptr<Transport> open_transport(const TransportOptions& options = {});

// How many ranks the launcher started this process among (Open MPI's mpirun sets
// OMPI_COMM_WORLD_SIZE, MPICH's and PMIx launchers PMI_SIZE / PMIX_SIZE); 1 for a plain start.
// Reads the environment only: MPI stays uninitialized.
int32_t launched_ranks();
// This process's rank as the launcher gave it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK); 0 for
// a plain start. Known before anything is opened: `serve` listens on rank 0 only.
int32_t launched_rank();

// Makes every wait for another rank, now and later, fail at once ("interrupted"): a server that
// gets SIGTERM under mpirun (which sends it when a rank died, SIGKILL following) tells its clients
// before that. Safe from any thread.
void interrupt_rank_waits();
bool rank_waits_interrupted();

// Whether this build can run over MPI.
bool transport_has_mpi();

// Every rank's `mine` (a plain value, the same type on every rank), in rank order. A collective.
template <typename T>
std::vector<T> gather_from_every_rank(Transport& transport, const T& mine, std::string_view what) {
  std::vector<T> all(size_t(transport.n_ranks()));
  transport.all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)),
                       what);
  return all;
}

// Throws tandem::Error unless every rank's `value` equals rank 0's, naming the ranks that differ,
// `what` ("the model file's size and header hash") and `fix` ("every machine must hold the same
// file"); every rank throws alike.
void check_same_on_every_rank(Transport& transport, uint64_t value, std::string_view what,
                              std::string_view fix);

}  // namespace tandem
