// The chunk machinery: each group's dispatcher cuts copies into chunks, picks a path for each (shortest
// queue, direct first; failed paths are skipped and their chunks retried elsewhere), issues them, and
// each path's worker completes and settles them; per-path rates. The Engine class is in scheduler.hpp.

#include "scheduler.hpp"

namespace ge {

// A dispatcher that finds no room for its next chunk (its path at `outstanding`, the staging ring
// full, the relay shard full) looks again after this nap, or sooner when a landing chunk wakes it.
constexpr std::chrono::milliseconds kNoRoomNap{2};

// A path's recent rate is the bytes it landed over the last kRateWindowS seconds (real time), from
// the oldest mark inside the window; spans under kRateMinSpanS read as 0 (too short to mean anything).
constexpr double kRateWindowS = 1.0;
constexpr double kRateMinSpanS = 1e-3;

void Engine::finish_chunk(Chunk *ch, int rc) {
  auto c = ch->copy;
  delete ch;
  if (rc) {
    std::lock_guard<std::mutex> lk(c->m);
    if (c->status == GE_OK) c->status = rc;
  }
  c->chunks_done.fetch_add(1);
  if (c->remaining.fetch_sub(1) == 1) finish_copy(*c);
}

void Engine::finish_copy(Copy &c) {
  be_->stream_end(c);
  std::lock_guard<std::mutex> lk(c.m);
  c.finished = true;
  c.landed.store(true, std::memory_order_release);
  c.cv.notify_all();
}

Path *Engine::pick_path(Group &g, const Copy &c, bool *all_failed) {
  Path *best = nullptr;
  *all_failed = true;
  Path *direct = g.paths[0];
  // A copy that only the direct path takes keeps that path's stream fed with every chunk it has
  // (staged copies are bounded by the ring's slots), so the copy engine never idles between chunks.
  int limit = c.single_path ? INT32_MAX : c.knobs.outstanding;
  if (!direct->failed) {
    *all_failed = false;
    if (direct->depth < limit && (c.single_path || c.knobs.direct_first)) return direct;
    if (c.single_path) return nullptr;  // below the fallback threshold: wait for the direct path
  }
  for (Path *p : g.paths) {
    if (p->failed) continue;
    *all_failed = false;
    if (p->depth >= limit) continue;
    if (!best || p->depth < best->depth) best = p;
  }
  return best;
}

Chunk *Engine::make_chunk(const std::shared_ptr<Copy> &c, uint64_t idx) {
  auto *ch = new Chunk;
  ch->copy = c;
  ch->off = idx ? idx * c->chunk - c->skew : 0;
  ch->len = std::min((idx + 1) * c->chunk - c->skew, c->nbytes) - ch->off;
  if (c->dir == GE_H2D) {
    ch->host = c->src + ch->off;
    ch->dev = c->dst + ch->off;
  } else {
    ch->host = c->dst + ch->off;
    ch->dev = c->src + ch->off;
  }
  return ch;
}

void Engine::dispatch_loop(Group &g) {
  name_thread(g.dir == GE_H2D ? "ge-disp%d-h2d" : "ge-disp%d-d2h", g.gpu);
  be_->thread_init(g.gpu);
  std::unique_lock<std::mutex> lk(g.m);
  while (!stopping_) {
    switch (dispatch_step(g, lk)) {
      case Step::kMoved:
        break;
      case Step::kIdle:
        g.cv.wait(lk, [&] { return stopping_ || !g.copies.empty() || !g.ready.empty() || !g.retry.empty(); });
        break;
      case Step::kNoRoom:
        g.cv.wait_for(lk, kNoRoomNap);
        break;
    }
  }
  fail_unissued(g, lk);
}

// One step, group lock held throughout (released only around finishing a failed chunk): the next
// chunk of the group goes to a path, or the reason it cannot is returned.
Engine::Step Engine::dispatch_step(Group &g, std::unique_lock<std::mutex> &lk) {
  Next n = next_work(g);
  if (!n.copy) return Step::kIdle;
  Copy &c = *n.copy;
  if (!n.chunk) {
    if (c.next_chunk >= c.nchunks) {  // every chunk of the front copy is out
      g.copies.pop_front();
      return Step::kMoved;
    }
    if (c.host_mode == GE_HOST_STAGED && c.dir == GE_H2D) return stage_h2d(g, n.copy);  // fill a slot first
  }
  bool all_failed = false;
  Path *p = pick_path(g, c, &all_failed);
  if (all_failed) {
    fail_next(n, lk);
    return Step::kMoved;
  }
  if (!p) return Step::kNoRoom;
  Chunk *ch = take_chunk(n);
  if (!ch) return Step::kNoRoom;
  return issue_chunk(g, *p, ch);
}

// Chunks waiting to be issued again come first, then staged chunks that are filled, then the front copy.
Engine::Next Engine::next_work(Group &g) {
  Next n;
  if (!g.retry.empty()) n.from = &g.retry;
  else if (!g.ready.empty()) n.from = &g.ready;
  if (n.from) {
    n.chunk = n.from->front();
    n.copy = n.chunk->copy;
  } else if (!g.copies.empty()) {
    n.copy = g.copies.front();
  }
  return n;
}

// A staged H2D chunk: a slot of the ring is filled by a staging thread, which then queues the chunk
// on the group's `ready` list. The slot is released when the chunk lands (settle) or fails.
Engine::Step Engine::stage_h2d(Group &g, const std::shared_ptr<Copy> &c) {
  uint64_t slot = try_stage(*c);
  if (!slot) return Step::kNoRoom;
  Chunk *nc = make_chunk(c, c->next_chunk++);
  nc->stage = slot;
  Path *direct = g.paths[0];
  staging_.copy(slot, nc->host, nc->len, kFillMode, [this, nc, slot, &g, direct](uint64_t cpu_ns) {
    nc->host = slot;
    direct->cpu_ns += cpu_ns;
    {
      std::lock_guard<std::mutex> l2(g.m);
      g.ready.push_back(nc);
    }
    g.cv.notify_all();
  });
  return Step::kMoved;
}

// The chunk of `n` now leaving its queue, or a new chunk of the front copy (with a staging slot for a
// staged D2H copy: nullptr while the ring is full).
Chunk *Engine::take_chunk(Next &n) {
  if (n.chunk) {
    n.from->pop_front();
    return n.chunk;
  }
  uint64_t slot = 0;
  if (n.copy->host_mode == GE_HOST_STAGED && !(slot = try_stage(*n.copy))) return nullptr;  // D2H: the path writes into a slot
  Chunk *ch = make_chunk(n.copy, n.copy->next_chunk++);
  ch->stage = slot;
  return ch;
}

// Every path that could carry the next chunk has failed: it fails its copy with GE_EPATH.
void Engine::fail_next(Next &n, std::unique_lock<std::mutex> &lk) {
  Chunk *ch = n.chunk;
  if (ch) n.from->pop_front();
  else ch = make_chunk(n.copy, n.copy->next_chunk++);
  if (ch->stage) release_stage(ch->stage);
  lk.unlock();
  finish_chunk(ch, GE_EPATH);
  lk.lock();
}

// Takes a relay block if the path needs one (none free: back to the front of retry, no room), then
// issues; a path that fails to issue is marked failed and the chunk goes back to retry.
Engine::Step Engine::issue_chunk(Group &g, Path &p, Chunk *ch) {
  if (ch->stage && ch->copy->dir == GE_D2H) ch->host = ch->stage;
  uint64_t t0 = thread_cpu_ns();
  if (p.via != p.gpu && pools_.relay_get(p.via, ch->copy->knobs, &ch->relay)) {
    // the relay shard is full for now (blocks come back as relayed chunks land): wait like for a
    // busy path; the direct path takes the chunk once it has room
    g.retry.push_front(ch);
    return Step::kNoRoom;
  }
  int rc = issue_on(p, *ch);
  p.cpu_ns += thread_cpu_ns() - t0;
  if (rc) {
    if (ch->relay) pools_.relay_put(p.via, ch->relay), ch->relay = 0;
    p.failed = true;
    g.retry.push_front(ch);
  }
  return Step::kMoved;
}

// Closing: fail what was never issued (chunks waiting for a retry, the chunks of queued copies).
void Engine::fail_unissued(Group &g, std::unique_lock<std::mutex> &lk) {
  while (!g.retry.empty()) {
    Chunk *x = g.retry.front();
    g.retry.pop_front();
    if (x->stage) release_stage(x->stage);
    lk.unlock();
    finish_chunk(x, GE_ECLOSED);
    lk.lock();
  }
  while (!g.copies.empty()) {
    auto c = g.copies.front();
    g.copies.pop_front();
    uint64_t left = c->nchunks - c->next_chunk;
    c->next_chunk = c->nchunks;
    for (uint64_t i = 0; i < left; ++i) {
      Chunk *x = new Chunk;
      x->copy = c;
      lk.unlock();
      finish_chunk(x, GE_ECLOSED);
      lk.lock();
    }
  }
}

int Engine::issue_on(Path &p, Chunk &ch) {
  ch.issue_t = real_now();
  int rc = be_->issue(p, ch);
  if (rc) return rc;
  ch.copy->path_used[p.id] = 1;
  p.depth++;
  if (ch.copy->nchunks == 1) ch.copy->sole_path = &p;
  p.q.push_back(&ch);
  p.cv.notify_one();
  return GE_OK;
}

void Engine::count_landed(Path &p, uint64_t len) {
  p.bytes += len;
  p.chunks += 1;
  (p.dir == GE_H2D ? link_h2d_ : link_d2h_)[p.via] += len;
  double now = real_now();
  std::lock_guard<std::mutex> lk(p.rate_m);
  int last = (p.mark_i + kRateMarks - 1) % kRateMarks;
  if (p.mark_n && now - p.mark_t[last] < kRateWindowS / kRateMarks) return;  // one mark per ring slot's share
  p.mark_t[p.mark_i] = now;
  p.mark_b[p.mark_i] = p.bytes.load();
  p.mark_i = (p.mark_i + 1) % kRateMarks;
  p.mark_n = std::min(p.mark_n + 1, kRateMarks);
}

double Engine::rate(Path &p) {
  double now = real_now();
  std::lock_guard<std::mutex> lk(p.rate_m);
  int best = -1;
  for (int i = 0; i < p.mark_n; ++i)
    if (p.mark_t[i] >= now - kRateWindowS && (best < 0 || p.mark_t[i] < p.mark_t[best])) best = i;
  if (best < 0) return 0.0;
  double dt = now - p.mark_t[best];
  if (dt < kRateMinSpanS) return 0.0;
  return double(p.bytes.load() - p.mark_b[best]) / (dt / time_scale_) / 1e9;
}

void Engine::run_chunk(Path &p, Chunk *ch, std::unique_lock<std::mutex> &lk) {
  uint64_t t0 = thread_cpu_ns();
  int rc = be_->complete(p, *ch);
  p.cpu_ns += thread_cpu_ns() - t0;
  if (ch->relay) pools_.relay_put(p.via, ch->relay), ch->relay = 0;
  lk.lock();
  settle(p, ch, rc, lk);
}

void Engine::settle(Path &p, Chunk *ch, int rc, std::unique_lock<std::mutex> &lk) {
  Group &g = *p.group;
  p.depth--;
  if (rc) {
    p.failed = true;
    if (++ch->attempts < kMaxAttempts && !stopping_) {
      if (ch->stage && ch->copy->dir == GE_D2H) ch->host = ch->stage;
      g.retry.push_back(ch);
      g.cv.notify_all();
      return;
    }
    g.cv.notify_all();
    lk.unlock();
    if (ch->stage) release_stage(ch->stage);
    finish_chunk(ch, rc);
    lk.lock();
    return;
  }
  g.cv.notify_all();
  lk.unlock();
  count_landed(p, ch->len);
  if (ch->stage && ch->copy->dir == GE_D2H) {
    drain_chunk(p, ch, [this, ch] { finish_chunk(ch, GE_OK); });
  } else {
    if (ch->stage) release_stage(ch->stage);
    finish_chunk(ch, GE_OK);
  }
  lk.lock();
}

void Engine::drain_chunk(Path &p, Chunk *ch, std::function<void()> then) {
  uint64_t dst = ch->copy->dst + ch->off;
  auto drained = [this, &p, ch, then = std::move(then)](uint64_t cpu_ns) {
    p.cpu_ns += cpu_ns;
    release_stage(ch->stage);
    then();
  };
  staging_.copy(dst, ch->host, ch->len, drain_mode(dst, ch->len), std::move(drained));
}

void Engine::worker_loop(Path &p) {
  name_thread("ge-path%d-via%d", p.id, p.via);
  be_->thread_init(p.via);
  precise_timers();
  Group &g = *p.group;
  std::unique_lock<std::mutex> lk(g.m);
  for (;;) {
    p.cv.wait(lk, [&] { return !p.q.empty() || stopping_; });
    if (p.q.empty()) return;
    Chunk *ch = p.q.front();
    p.q.pop_front();
    lk.unlock();
    run_chunk(p, ch, lk);
  }
}

}  // namespace ge
