// The transport between ranks (runtime/transport.h), run as one process and under
// `mpirun -np 2` and `-np 3` (tests/runtime/CMakeLists.txt): every rank runs every test, in the
// same order, so their collectives meet. Point to point in a ring with messages past MPI's eager
// limit (blocking, or started and finished apart), broadcast, gather and an all-to-all of uneven
// sizes give each rank exactly what was sent to it; a value that differs between ranks is refused
// on every rank, naming them; a peer that never answers is an error naming it after the timeout,
// not a hang. The test of a rank killed mid-run is disabled here and run by kill_rank.sh, which
// checks how mpirun ends.
#include "runtime/transport.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

Transport* g_transport = nullptr;
constexpr double kTimeoutS = 30;

// Deterministic bytes of a transfer from rank `from` to rank `to`.
std::vector<std::byte> pattern(int32_t from, int32_t to, size_t n) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = std::byte(uint8_t(i * 7 + size_t(from) * 31 + size_t(to) * 131));
  return bytes;
}

TEST(Transport, RingSendAndReceiveCarryLargeMessagesWhole) {
  Transport& t = *g_transport;
  if (t.n_ranks() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int32_t n = t.n_ranks(), r = t.rank();
  const int32_t next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t bytes = size_t(1) << 20;  // past the eager limit: the sender waits for the receiver
  const std::vector<std::byte> out = pattern(r, next, bytes);
  std::vector<std::byte> in(bytes);
  // Even ranks send first and odd ones receive first, so a ring of blocking calls cannot deadlock.
  if (r % 2 == 0) {
    t.send(next, out, "a ring message");
    t.receive(prev, in, "a ring message");
  } else {
    t.receive(prev, in, "a ring message");
    t.send(next, out, "a ring message");
  }
  EXPECT_EQ(in, pattern(prev, r, bytes));
}

// Every rank posts its receives and starts its sends without waiting: a ring that deadlocks with
// blocking large sends all going first completes, and two messages between the same ranks land in
// the order they were started, as a rank 0 with steps in flight relies on.
TEST(Transport, PendingTransfersWaitForNeitherEndAndMatchInOrder) {
  Transport& t = *g_transport;
  if (t.n_ranks() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int32_t n = t.n_ranks(), r = t.rank();
  const int32_t next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t big = size_t(1) << 20, small = 100;
  const std::vector<std::byte> out_big = pattern(r, next, big), out_small = pattern(next, r, small);
  std::vector<std::byte> in_big(big), in_small(small);
  std::unique_ptr<PendingTransfer> receives[] = {t.receive_later(prev, in_big, "the first"),
                                                 t.receive_later(prev, in_small, "the second")};
  std::unique_ptr<PendingTransfer> sends[] = {t.send_later(next, out_big, "the first"),
                                              t.send_later(next, out_small, "the second")};
  for (auto& pending : receives) pending->wait();
  for (auto& pending : sends) pending->wait();
  EXPECT_EQ(in_big, pattern(prev, r, big));
  EXPECT_EQ(in_small, pattern(r, prev, small));
}

// A pending receive dropped before any message came is cancelled: the next message goes to the
// next receive.
TEST(Transport, APendingReceiveDroppedUnfinishedTakesNoMessage) {
  Transport& t = *g_transport;
  if (t.n_ranks() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int32_t n = t.n_ranks(), r = t.rank();
  const int32_t next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::byte> dropped(8);
  t.receive_later(prev, dropped, "a message never sent").reset();
  // No message is sent before every rank has cancelled (a gather: a broadcast's root may pass it
  // before the others reach it).
  std::vector<std::byte> all(static_cast<size_t>(n));
  t.all_gather(std::span(dropped).first(1), all, "every rank past its cancel");
  const std::vector<std::byte> out = pattern(r, next, 8);
  std::vector<std::byte> in(8);
  std::unique_ptr<PendingTransfer> receive = t.receive_later(prev, in, "the ring message");
  t.send(next, out, "the ring message");
  receive->wait();
  EXPECT_EQ(in, pattern(prev, r, 8));
}

TEST(Transport, BroadcastAndGatherReachEveryRank) {
  Transport& t = *g_transport;
  const int32_t n = t.n_ranks(), r = t.rank(), root = n - 1;
  std::vector<std::byte> token = r == root ? pattern(root, -1, 12) : std::vector<std::byte>(12);
  t.broadcast(root, token, "the sampled token");
  EXPECT_EQ(token, pattern(root, -1, 12));
  const std::vector<std::byte> mine = pattern(r, 0, 5);
  std::vector<std::byte> all(5 * size_t(n));
  t.all_gather(mine, all, "each rank's bytes");
  for (int32_t q = 0; q < n; ++q)
    EXPECT_EQ(std::vector<std::byte>(all.begin() + 5 * q, all.begin() + 5 * (q + 1)),
              pattern(q, 0, 5));
}

TEST(Transport, AllToAllOfUnevenSizesGivesEachRankItsParts) {
  Transport& t = *g_transport;
  const int32_t n = t.n_ranks(), r = t.rank();
  // Rank a sends (a + 1) * (b + 2) bytes to rank b, some of them none (a == 1).
  auto count = [](int32_t a, int32_t b) { return a == 1 ? size_t(0) : size_t((a + 1) * (b + 2)); };
  std::vector<size_t> out_counts, in_counts;
  std::vector<std::byte> out;
  for (int32_t q = 0; q < n; ++q) {
    out_counts.push_back(count(r, q));
    in_counts.push_back(count(q, r));
    const std::vector<std::byte> part = pattern(r, q, count(r, q));
    out.insert(out.end(), part.begin(), part.end());
  }
  size_t total = 0;
  for (size_t c : in_counts) total += c;
  std::vector<std::byte> in(total);
  t.all_to_all(out, out_counts, in, in_counts, "routed tokens");
  size_t at = 0;
  for (int32_t q = 0; q < n; ++q) {
    EXPECT_EQ(std::vector<std::byte>(in.begin() + std::ptrdiff_t(at),
                                     in.begin() + std::ptrdiff_t(at + in_counts[size_t(q)])),
              pattern(q, r, count(q, r)))
        << "from rank " << q;
    at += in_counts[size_t(q)];
  }
}

TEST(Transport, AValueThatDiffersBetweenRanksIsRefusedOnEveryRank) {
  Transport& t = *g_transport;
  EXPECT_NO_THROW(check_same_on_every_rank(t, 0x1234, "the model file", "hold the same"));
  if (t.n_ranks() < 2) return;
  try {
    check_same_on_every_rank(t, t.rank() == 1 ? 7 : 8, "the model file's size and header hash",
                             "every machine must hold the same file");
    ADD_FAILURE() << "a differing value passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
  }
}

TEST(Transport, APeerThatNeverAnswersIsAnErrorNamingIt) {
  Transport& t = *g_transport;
  if (t.n_ranks() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  if (t.rank() == 1) {
    t.set_timeout(0.3);
    std::vector<std::byte> in(64);
    try {
      t.receive(0, in, "layer 3's input, step 9");
      ADD_FAILURE() << "a receive with no sender returned";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("receiving layer 3's input, step 9 from rank 0"), std::string::npos)
          << what;
      EXPECT_NE(what.find("no answer in 0.3 s"), std::string::npos) << what;
    }
    t.set_timeout(kTimeoutS);
  }
  // Every rank meets here again before the next test.
  std::vector<std::byte> all(size_t(t.n_ranks()));
  t.all_gather(std::vector<std::byte>(1), all, "the end of the timeout test");
}

TEST(Transport, OneProcessHasNoPeers) {
  Transport& t = *g_transport;
  if (t.n_ranks() != 1) GTEST_SKIP() << "the single-process transport";
  EXPECT_EQ(t.describe(), "single process");
  std::vector<std::byte> buffer(4);
  EXPECT_THROW(t.send(1, buffer, "x"), Error);
  EXPECT_THROW(t.receive(1, buffer, "x"), Error);
  EXPECT_THROW(t.send_later(1, buffer, "x"), Error);
  EXPECT_THROW(t.receive_later(1, buffer, "x"), Error);
  EXPECT_THROW(open_transport({.timeout_s = 0}), Error);
}

// Run by kill_rank.sh only: rank 1 dies while rank 0 waits for it; mpirun must end the run.
TEST(Transport, DISABLED_ARankThatDiesEndsTheRun) {
  Transport& t = *g_transport;
  ASSERT_GE(t.n_ranks(), 2);
  if (t.rank() == 1) std::raise(SIGKILL);
  std::vector<std::byte> in(8);
  t.receive(1, in, "the killed rank's answer");
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<tandem::Transport> transport =
      tandem::open_transport({.timeout_s = tandem::kTimeoutS});
  tandem::g_transport = transport.get();
  std::printf("transport: %s, rank %d\n", transport->describe().c_str(), transport->rank());
  const int result = RUN_ALL_TESTS();
  transport.reset();
  return result;
}
