// The step's own threads: a fixed team that runs one job per pass (the calling thread is member 0) and meets at
// barriers inside it. A member that throws does not leave the others waiting: the job is marked failed, every
// barrier of it returns at once, and run() rethrows the first exception once all members are back. Waiting spins briefly, then yields the core, then sleeps: spinning alone (OpenMP's active
// policy, and libgomp's default here) turned each of a pass's ~150 barriers into a scheduler time slice once
// another process shared the two cores (1.1 s a pass instead of 20 ms, measured); sleeping alone costs a wake-up
// per barrier on an idle machine.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define BN_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define BN_PAUSE() asm volatile("yield")
#else
#define BN_PAUSE() ((void)0)
#endif

namespace bitnest {

class Pool {
 public:
  explicit Pool(int threads) : n_(threads < 1 ? 1 : threads) {
    for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { work(t); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      epoch_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int size() const { return n_; }

  // fn(tid, n) on every member, the caller as member 0; returns when all are done (rethrowing a member's exception).
  void run(const std::function<void(int, int)>& fn) {
    job_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      epoch_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    call(0);
    wait([&] { return done_.load(std::memory_order_acquire) == n_ - 1; });
    arrived_.store(0, std::memory_order_relaxed);      // a failed job may have left a barrier half-filled
    if (error_) std::rethrow_exception(error_);
  }

  // Every member calls it; none leaves before all have arrived (or the job has failed).
  void barrier() {
    if (n_ == 1 || failed_.load(std::memory_order_acquire)) return;
    const uint64_t phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(mu_);
        phase_.store(phase + 1, std::memory_order_release);
      }
      cv_.notify_all();
    } else {
      wait([&] { return phase_.load(std::memory_order_acquire) != phase || failed_.load(std::memory_order_acquire); });
    }
  }

 private:
  // Spin ~ a few microseconds, yield for up to a millisecond, then sleep until notified.
  template <class Ready>
  void wait(Ready ready) {
    for (int i = 0; i < 2000; ++i) {
      if (ready()) return;
      BN_PAUSE();
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (std::chrono::steady_clock::now() < until) {
      if (ready()) return;
      std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, ready);
  }

  void work(int tid) {
    uint64_t seen = 0;
    for (;;) {
      wait([&] { return epoch_.load(std::memory_order_acquire) != seen; });
      seen = epoch_.load(std::memory_order_acquire);
      if (stop_) return;
      call(tid);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_ - 1) {
        std::lock_guard<std::mutex> lock(mu_);       // the caller may be asleep on cv_
      }
      cv_.notify_all();
    }
  }

  void call(int tid) {
    try {
      (*job_)(tid, n_);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_release);
      }
      cv_.notify_all();
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> epoch_{0}, phase_{0};
  std::atomic<int> done_{0}, arrived_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace bitnest
