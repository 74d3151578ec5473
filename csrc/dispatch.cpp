// The chunk machinery: each group's dispatcher cuts copies into chunks, picks a path for each (shortest
// queue, direct first; failed paths are skipped and their chunks retried elsewhere), issues them, and
// each path's worker completes and settles them; per-path rates. The Engine class is in scheduler.hpp.
#include <cstring>

#include "scheduler.hpp"

namespace ge {

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
  be->stream_end(c);
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
  be->thread_init(g.gpu);
  std::unique_lock<std::mutex> lk(g.m);
  for (;;) {
    if (stopping) break;
    Chunk *ch = nullptr;
    std::deque<Chunk *> *from = nullptr;
    std::shared_ptr<Copy> c;
    if (!g.retry.empty()) from = &g.retry;
    else if (!g.ready.empty()) from = &g.ready;
    if (from) {
      ch = from->front();
      c = ch->copy;
    } else if (!g.copies.empty()) {
      c = g.copies.front();
      if (c->next_chunk >= c->nchunks) {
        g.copies.pop_front();
        continue;
      }
      if (c->host_mode == GE_HOST_STAGED && c->dir == GE_H2D) {  // fill a slot first
        uint64_t slot = try_stage(*c);
        if (!slot) {
          g.cv.wait_for(lk, std::chrono::milliseconds(2));
          continue;
        }
        Chunk *nc = make_chunk(c, c->next_chunk++);
        nc->stage = slot;
        Path *direct = g.paths[0];
        submit_staging([this, nc, slot, &g, direct] {
          uint64_t t0 = thread_cpu_ns();
          std::memcpy(reinterpret_cast<void *>(slot), reinterpret_cast<const void *>(nc->host), nc->len);
          nc->host = slot;
          direct->cpu_ns += thread_cpu_ns() - t0;
          {
            std::lock_guard<std::mutex> l2(g.m);
            g.ready.push_back(nc);
          }
          g.cv.notify_all();
        });
        continue;
      }
    } else {
      g.cv.wait(lk, [&] { return stopping || !g.copies.empty() || !g.ready.empty() || !g.retry.empty(); });
      continue;
    }
    bool all_failed = false;
    Path *p = pick_path(g, *c, &all_failed);
    if (all_failed) {
      if (!ch) ch = make_chunk(c, c->next_chunk++);
      else from->pop_front();
      if (ch->stage) release_stage(ch->stage);
      lk.unlock();
      finish_chunk(ch, GE_EPATH);
      lk.lock();
      continue;
    }
    if (!p) {
      g.cv.wait_for(lk, std::chrono::milliseconds(2));
      continue;
    }
    if (!ch) {  // a new chunk of the front copy
      uint64_t s = 0;
      if (c->host_mode == GE_HOST_STAGED) {  // D2H: the path writes into a slot
        s = try_stage(*c);
        if (!s) {
          g.cv.wait_for(lk, std::chrono::milliseconds(2));
          continue;
        }
      }
      ch = make_chunk(c, c->next_chunk++);
      ch->stage = s;
    } else {
      from->pop_front();
    }
    if (ch->stage && c->dir == GE_D2H) ch->host = ch->stage;
    uint64_t t0 = thread_cpu_ns();
    if (p->via != p->gpu && relay_get(p->via, *c, &ch->relay)) {
      // the relay shard is full for now (blocks come back as relayed chunks land): wait like for a
      // busy path; the direct path takes the chunk once it has room
      g.retry.push_front(ch);
      g.cv.wait_for(lk, std::chrono::milliseconds(2));
      continue;
    }
    int rc = issue_on(*p, *ch);
    p->cpu_ns += thread_cpu_ns() - t0;
    if (rc) {
      if (ch->relay) relay_put(p->via, ch->relay), ch->relay = 0;
      p->failed = true;
      g.retry.push_front(ch);
      continue;
    }
  }
  // closing: fail what was never issued
  auto fail_all = [&](std::deque<Chunk *> &dq) {
    while (!dq.empty()) {
      Chunk *x = dq.front();
      dq.pop_front();
      if (x->stage) release_stage(x->stage);
      lk.unlock();
      finish_chunk(x, GE_ECLOSED);
      lk.lock();
    }
  };
  fail_all(g.retry);
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
  int rc = be->issue(p, ch);
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
  (p.dir == GE_H2D ? link_h2d : link_d2h)[p.via] += len;
  double now = real_now();
  std::lock_guard<std::mutex> lk(p.rate_m);
  int last = (p.mark_i + 15) % 16;
  if (p.mark_n && now - p.mark_t[last] < 1.0 / 16) return;
  p.mark_t[p.mark_i] = now;
  p.mark_b[p.mark_i] = p.bytes.load();
  p.mark_i = (p.mark_i + 1) % 16;
  p.mark_n = std::min(p.mark_n + 1, 16);
}

double Engine::rate(Path &p) {
  double now = real_now();
  std::lock_guard<std::mutex> lk(p.rate_m);
  int best = -1;
  for (int i = 0; i < p.mark_n; ++i)
    if (p.mark_t[i] >= now - 1.0 && (best < 0 || p.mark_t[i] < p.mark_t[best])) best = i;
  if (best < 0) return 0.0;
  double dt = now - p.mark_t[best];
  if (dt < 1e-3) return 0.0;
  return double(p.bytes.load() - p.mark_b[best]) / (dt / time_scale) / 1e9;
}

void Engine::run_chunk(Path &p, Chunk *ch, std::unique_lock<std::mutex> &lk) {
  uint64_t t0 = thread_cpu_ns();
  int rc = be->complete(p, *ch);
  p.cpu_ns += thread_cpu_ns() - t0;
  if (ch->relay) relay_put(p.via, ch->relay), ch->relay = 0;
  lk.lock();
  settle(p, ch, rc, lk);
}

void Engine::settle(Path &p, Chunk *ch, int rc, std::unique_lock<std::mutex> &lk) {
  Group &g = *p.group;
  p.depth--;
  if (rc) {
    p.failed = true;
    if (++ch->attempts < kMaxAttempts && !stopping) {
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
    submit_staging([this, ch, &p] {
      uint64_t t1 = thread_cpu_ns();
      const Copy &c = *ch->copy;
      std::memcpy(reinterpret_cast<void *>(c.dst + ch->off), reinterpret_cast<const void *>(ch->host), ch->len);
      p.cpu_ns += thread_cpu_ns() - t1;
      release_stage(ch->stage);
      finish_chunk(ch, GE_OK);
    });
  } else {
    if (ch->stage) release_stage(ch->stage);
    finish_chunk(ch, GE_OK);
  }
  lk.lock();
}

void Engine::worker_loop(Path &p) {
  be->thread_init(p.via);
  precise_timers();
  Group &g = *p.group;
  std::unique_lock<std::mutex> lk(g.m);
  for (;;) {
    p.cv.wait(lk, [&] { return !p.q.empty() || stopping; });
    if (p.q.empty()) return;
    Chunk *ch = p.q.front();
    p.q.pop_front();
    lk.unlock();
    run_chunk(p, ch, lk);
  }
}

}  // namespace ge
