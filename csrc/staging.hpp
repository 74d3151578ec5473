// The staging threads: a resizable pool of threads running memcpy tasks between pageable user memory
// and pinned staging slots (the dispatchers submit H2D fills, path workers D2H drains).
#pragma once

#include <condition_variable>
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

  // Runs `task` on a staging thread, or on this thread once stop() has begun (a waiter that
  // finishes its own chunk while the engine closes still gets its bytes drained).
  void submit(std::function<void()> task);

  // Runs the queued tasks, then joins every thread. Idempotent.
  void stop();

 private:
  void loop();

  std::mutex m_;
  std::condition_variable cv_;                 // a task, a resize or stop()
  std::deque<std::function<void()>> tasks_;    // guarded by m_
  std::vector<std::thread> threads_;           // every thread ever started (extra ones have returned)
  int target_ = 0, alive_ = 0;                 // guarded by m_
  bool stop_ = false;                          // guarded by m_
};

}  // namespace ge
