// The staging threads: a resizable pool of threads running memcpy tasks between pageable user memory
// and pinned staging slots (the dispatchers submit H2D fills, path workers D2H drains).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ge {

class StagingThreads {
 public:
  StagingThreads() = default;
  StagingThreads(const StagingThreads &) = delete;
  StagingThreads &operator=(const StagingThreads &) = delete;
  ~StagingThreads() { stop(); }

  // Runs `n` threads from now on: more start at once, extra ones leave after their current task.
  void resize(int n);

  // How a staged chunk's memcpy runs (copy()).
  enum class CopyMode {
    kPiecesStreaming,  // split over the threads, non-temporal stores: H2D fills (the destination is a
                       // pinned slot that only the copy engine reads) and D2H drains into memory
                       // already faulted in
    kWhole,            // one task, plain stores (D2H drains into fresh memory, see Engine::drain_mode)
  };

  // A staged chunk's memcpy: `len` bytes from src to dst, in pieces of about kPieceBytes run by as many
  // threads (at most one piece a thread), so the time from a chunk's landing (or its slot's taking) to
  // its bytes' arrival is a piece's copy, not a whole chunk's, and the last chunks of a copy make a
  // short tail.
  // `done(cpu_ns)` runs once, on the thread that finishes the last piece, with the thread CPU time of
  // all the pieces.
  void copy(uint64_t dst, uint64_t src, uint64_t len, CopyMode mode, std::function<void(uint64_t)> done);

  // Runs one queued task on the calling thread, if there is one (true): a caller waiting for the pieces
  // of its own chunks copies them instead of spinning.
  bool run_one();

  // Thread CPU time of the pieces the calling thread has run (each piece's time also goes to its copy's
  // done()): a caller that runs pieces (run_one) takes it off its own time, so nothing counts twice.
  static uint64_t pieces_cpu_ns();

  // Runs the queued tasks, then joins every thread. Idempotent.
  void stop();

  // Pieces of 256 KiB: a 2 MiB D2H chunk, the last of a synchronous copy too, is drained in eighths by
  // 8 threads, not in quarters. On the H200 host (64 copies of 32 MiB, 8 threads, two processes) 256 KiB
  // pieces drained at 43.4 and 44.7 GB/s against 40.8 and 42.4 for 512 KiB.
  static constexpr uint64_t kPieceBytes = 256ull << 10;
  // A thread that finds no task looks again, yielding, for this long before it sleeps: a copy's next
  // chunk lands tens of microseconds later, and a futex wake-up on a VM costs about as much.
  static constexpr double kIdleSpinS = 500e-6;

 private:
  void loop();
  // Takes one queued task's ticket (queued_), without the lock: threads that find none keep spinning on
  // an atomic instead of queueing on m_. A ticket's task is then popped under m_.
  bool claim();
  // Queues tasks under one lock, waking a thread for each; once stop() has begun, runs them on this
  // thread (a waiter that finishes its own chunk while the engine closes still gets its bytes drained).
  void submit_all(std::vector<std::function<void()>> &tasks);

  std::mutex m_;
  std::condition_variable cv_;                 // a task, a resize or stop()
  std::deque<std::function<void()>> tasks_;    // guarded by m_
  std::atomic<size_t> queued_{0};              // tasks queued and not yet claimed (tickets; see claim())
  std::vector<std::thread> threads_;           // every thread ever started (extra ones have returned)
  int target_ = 0, alive_ = 0;                 // guarded by m_
  bool stop_ = false;                          // guarded by m_
};

}  // namespace ge
