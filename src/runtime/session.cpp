// Sessions: multi-turn conversations over the engine. A turn is a request whose prompt is the
// session's history plus the turn's new tokens; its reply joins the history when it completes.
#include <spdlog/spdlog.h>

#include "dsa/engine.h"
#include "engine_state.h"

namespace dsa {

int64_t Engine::open_session(SessionPolicy policy) {
  const int64_t id = next_id_++;
  auto s = std::make_unique<Session>();
  s->state.policy = policy;
  sessions_[id] = std::move(s);
  return id;
}

const SessionState& Engine::session(int64_t id) const {
  auto it = sessions_.find(id);
  require(it != sessions_.end(), ErrorCode::kInvalidArgument, "unknown session {}", id);
  return it->second->state;
}

int64_t Engine::submit_turn(int64_t session_id, std::vector<int32_t> new_tokens,
                            const RequestParams& params) {
  auto it = sessions_.find(session_id);
  require(it != sessions_.end(), ErrorCode::kInvalidArgument, "unknown session {}", session_id);
  Session& s = *it->second;
  require(s.state.active_request < 0, ErrorCode::kInvalidArgument,
          "session {} already has turn request {} in flight", session_id, s.state.active_request);
  validate(new_tokens, params);
  auto r = std::make_unique<Request>();
  r->session = session_id;
  r->seq = s.state.history;
  r->seq.insert(r->seq.end(), new_tokens.begin(), new_tokens.end());
  r->params = params;
  s.state.active_request = enqueue(std::move(r));
  return s.state.active_request;
}

void Engine::close_session(int64_t session_id) {
  auto it = sessions_.find(session_id);
  require(it != sessions_.end(), ErrorCode::kInvalidArgument, "unknown session {}", session_id);
  if (it->second->state.active_request >= 0) abort(it->second->state.active_request);
  release_pages(it->second->pages);
  sessions_.erase(it);
}

// The turn's request is ending. A completed turn's prompt and reply become the history; the
// pages stay with the session under kKeepCache, and go back to the pool otherwise (always for
// an aborted or failed turn, whose history is left as it was).
void Engine::end_turn(Request& r, bool completed) {
  Session& s = *sessions_.at(r.session);
  s.state.active_request = -1;
  s.last_used = stats_.steps;
  if (completed) {
    s.state.history = r.seq;
    ++s.state.turns;
  }
  if (completed && s.state.policy == SessionPolicy::kKeepCache) {
    s.pages = std::move(r.pages);
    r.pages = PageTable();
    s.n_cached = r.n_cached;
  } else {
    keep_tail(r);
    release_pages(r.pages);
    s.n_cached = 0;
  }
}

// Releases the kept cache of the least recently used session that holds one. False when none
// does.
bool Engine::evict_idle_session() {
  Session* victim = nullptr;
  int64_t victim_id = -1;
  for (auto& [id, s] : sessions_) {
    if (s->pages.pages().empty()) continue;
    if (!victim || s->last_used < victim->last_used) {
      victim = s.get();
      victim_id = id;
    }
  }
  if (!victim) return false;
  spdlog::debug("engine: evicting the kept cache of idle session {} ({} pages)", victim_id,
                victim->pages.pages().size());
  release_pages(victim->pages);
  victim->n_cached = 0;
  ++stats_.evicted_sessions;
  return true;
}

}  // namespace dsa
