#pragma once
// Cluster files (`tandem plan --cluster FILE`): the machines a run over MPI ranks spans, unlike
// or alike, and the network between them. The first machine is where rank 0 runs. Every
// machine's GPUs, RAM and CPU are planned: experts that no GPU holds go to the RAM of the machine
// that runs their layer.
//
//   machines:
//     - gpus: [a100-80g, a100-80g]    # as --gpu takes them; "8x a100-80g" gives eight
//       link: nvlink                  # between this machine's GPUs (as --link)
//       ram: 1TiB                     # as --ram (the default reserve kept free)
//       cpu_cores: 64                 # as --cpu-cores
//       host_bandwidth: 200           # GB/s (as --host-bandwidth)
//     - gpus: [8x 48GiB]              # ram, cpu_cores, host_bandwidth left out: the first's
//       link: pcie4
//   network: ib-ndr                   # as --node-link (ib-hdr assumed when left out)
#include <cstdint>
#include <string>
#include <string_view>

#include "plan/hardware.h"

namespace tandem::plan {

// The hardware of the machines `yaml_text` describes (GPUs of machine N named "nodeN:cuda:M"
// beyond the first); `threads` measure this machine's memory bandwidth when the first machine's
// is not given. Throws tandem::Error naming `source`, the machine and the field.
Hardware parse_cluster(std::string_view yaml_text, std::string_view source, int32_t threads);
Hardware load_cluster(const std::string& path, int32_t threads);

}  // namespace tandem::plan
