// The DSML tool-call state machine. Input accumulates in buf_ (positions are absolute offsets
// into the whole generated text; buf_ starts at base_), and every state scans forward from pos_.
// Text that may still turn out to be markup is held, never emitted: a held tail is at most one
// tag long, so each byte is scanned a bounded number of times and work stays linear.
//
// mark_ is the first byte not yet accounted for: before a call begins it is the envelope's
// start, so a fault can hand the whole envelope back to content; after, it follows the last
// accepted element.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "dsa/text/chat.h"
#include "dsa/text/tool_calls.h"
#include "text/chat_format.h"
#include "text/py_json.h"

namespace dsa::text {
namespace {

enum class State {
  kReasoning,   // before "</think>"
  kContent,     // plain text; looking for an envelope or a bare invoke
  kBlock,       // inside an envelope, between invokes
  kInvokeHead,  // after "<｜DSML｜invoke": name="NAME">
  kInvokeBody,  // inside an invoke, between parameters
  kParamHead,   // after "<｜DSML｜parameter": name="P" string="true|false">
  kStringValue,
  kJsonValue,
};

enum class Match { kNo, kPartial, kFull };

constexpr size_t kMaxNameBytes = 256;  // longer tool/parameter names are malformed

// Literal tags.
const std::string kWrapOpenV32 = fmt::format("<{}function_calls>", kDsml);
const std::string kWrapOpenV4 = fmt::format("<{}tool_calls>", kDsml);
const std::string kInvokeOpen = fmt::format("<{}invoke", kDsml);
const std::string kInvokeClose = fmt::format("</{}invoke>", kDsml);
const std::string kParamOpen = fmt::format("<{}parameter", kDsml);
const std::string kParamCloseStem = fmt::format("</{}parameter", kDsml);  // then ">"

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Bytes at the end of s that start a UTF-8 character whose remaining bytes have not arrived.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

struct ToolCallParser::Impl {
  ToolCallParserOptions opt;
  ParsedCompletion res;
  std::vector<ChatDelta> out;  // the deltas of the current feed()/finish()

  std::string buf_;
  size_t base_ = 0;  // absolute offset of buf_[0]
  size_t pos_ = 0;   // scan position (absolute)
  size_t mark_ = 0;  // first byte not yet accounted for (absolute)
  bool eof_ = false;
  State state_ = State::kContent;
  bool raw_on_ = false;  // text after the reasoning is being copied to res.raw

  // The envelope or invoke being read.
  bool wrapped_ = false;    // inside <｜DSML｜..._calls>
  std::string wrap_close_;  // its closing tag
  int block_calls_ = 0;     // calls begun in this envelope
  bool call_open_ = false;  // a call has begun and not ended
  bool args_open_ = false;  // its "{" has been emitted
  std::unordered_set<std::string> param_names_;
  size_t param_start_ = 0;  // the '<' of the parameter being read
  std::string param_name_;
  bool param_is_string_ = false;
  size_t value_start_ = 0;  // first byte of a string="false" value

  // A trailing part of a UTF-8 character, held until its remaining bytes come.
  ChatDelta carry_;
  bool has_carry_ = false;

  explicit Impl(ToolCallParserOptions o) : opt(std::move(o)) {
    if (!opt.make_id) opt.make_id = [](int i) { return fmt::format("call_{}", i); };
    state_ = opt.thinking ? State::kReasoning : State::kContent;
    raw_on_ = !opt.thinking;
  }

  // ---- input access ----
  size_t end() const { return base_ + buf_.size(); }
  char at(size_t p) const { return buf_[p - base_]; }
  std::string_view span(size_t from, size_t to) const {
    return std::string_view(buf_).substr(from - base_, to - from);
  }

  Match match(size_t p, std::string_view lit) const {
    const size_t avail = end() - p;
    const size_t n = std::min(avail, lit.size());
    if (span(p, p + n) != lit.substr(0, n)) return Match::kNo;
    if (n == lit.size()) return Match::kFull;
    return eof_ ? Match::kNo : Match::kPartial;
  }

  // Length of the longest tail of [from, end) that is a proper prefix of lit. At the end of the
  // text nothing is held, unless `even_at_end` (a cut-off tag is then reported, not emitted).
  size_t held_tail(size_t from, std::string_view lit, bool even_at_end = false) const {
    if (eof_ && !even_at_end) return 0;
    const size_t avail = end() - from;
    for (size_t k = std::min(avail, lit.size() - 1); k > 0; --k) {
      if (span(end() - k, end()) == lit.substr(0, k)) return k;
    }
    return 0;
  }

  // ---- output ----
  void push(ChatDelta::Kind kind, std::string_view text, int index = -1) {
    if (text.empty()) return;
    if (has_carry_ && (carry_.kind != kind || carry_.index != index)) flush_carry();
    std::string piece = has_carry_ ? carry_.text + std::string(text) : std::string(text);
    has_carry_ = false;
    if (!out.empty() && out.back().kind == kind && out.back().index == index &&
        kind != ChatDelta::Kind::kToolCallStart) {
      out.back().text += piece;
    } else {
      ChatDelta d;
      d.kind = kind;
      d.index = index;
      d.text = std::move(piece);
      out.push_back(std::move(d));
    }
    switch (kind) {
      case ChatDelta::Kind::kReasoning:
        res.reasoning_content += text;
        break;
      case ChatDelta::Kind::kContent:
        res.content += text;
        break;
      case ChatDelta::Kind::kToolCallArguments:
        res.tool_calls.back().arguments += text;
        break;
      case ChatDelta::Kind::kToolCallStart:
        break;
    }
  }
  void flush_carry() {
    if (!has_carry_) return;
    has_carry_ = false;
    ChatDelta d = std::move(carry_);
    out.push_back(std::move(d));
  }
  // At the end of a feed, a delta must not end inside a UTF-8 character.
  void hold_partial_character() {
    if (out.empty() || out.back().kind == ChatDelta::Kind::kToolCallStart) return;
    const size_t tail = incomplete_utf8_tail(out.back().text);
    if (tail == 0) return;
    carry_.kind = out.back().kind;
    carry_.index = out.back().index;
    carry_.text = out.back().text.substr(out.back().text.size() - tail);
    out.back().text.resize(out.back().text.size() - tail);
    if (out.back().text.empty()) out.pop_back();
    has_carry_ = true;
  }

  void content(size_t from, size_t to) {
    if (to > from) push(ChatDelta::Kind::kContent, span(from, to));
  }
  void args(std::string_view text) {
    push(ChatDelta::Kind::kToolCallArguments, text, res.tool_calls.back().index);
  }
  void args_escaped(size_t from, size_t to) {
    if (to <= from) return;
    std::string esc;
    append_py_json_escaped(esc, span(from, to));
    args(esc);
  }

  // ---- calls ----
  void begin_call(std::string name) {
    ParsedToolCall call;
    call.index = int(res.tool_calls.size());
    call.id = opt.make_id(call.index);
    call.name = std::move(name);
    if (has_carry_) flush_carry();
    ChatDelta d;
    d.kind = ChatDelta::Kind::kToolCallStart;
    d.index = call.index;
    d.id = call.id;
    d.name = call.name;
    out.push_back(std::move(d));
    res.tool_calls.push_back(std::move(call));
    call_open_ = true;
    args_open_ = false;
    param_names_.clear();
    ++block_calls_;
  }
  void param_prefix(const std::string& name) {
    std::string s = args_open_ ? ", \"" : "{\"";
    args_open_ = true;
    append_py_json_escaped(s, name);
    s += "\": ";
    args(s);
  }
  void end_call(bool complete) {
    args(args_open_ ? "}" : "{}");
    res.tool_calls.back().complete = complete;
    if (!complete) ++res.malformed_calls;
    call_open_ = false;
  }

  // A fault at `at`: end what is open, hand the unaccounted text to content, rescan from `at`.
  void fault(size_t at) {
    if (call_open_) {
      if (state_ == State::kStringValue) args("\"");
      end_call(/*complete=*/false);
    } else {
      ++res.rejected_blocks;
    }
    content(mark_, at);
    pos_ = mark_ = at;
    wrapped_ = false;
    state_ = State::kContent;
  }

  // ---- attribute reading for headers: ws+ name="VALUE" ----
  // Returns kFull with *value and *next set, kPartial when more input is needed, kNo on a fault.
  Match attribute(size_t p, std::string_view attr, bool need_space, std::string* value,
                  size_t* next) const {
    size_t q = p;
    while (q < end() && is_space(at(q))) ++q;
    if (q == end()) return eof_ ? Match::kNo : Match::kPartial;
    if (need_space && q == p) return Match::kNo;
    const std::string open = fmt::format("{}=\"", attr);
    const Match m = match(q, open);
    if (m != Match::kFull) return m;
    q += open.size();
    const size_t limit = std::min(end(), q + kMaxNameBytes + 1);
    for (size_t r = q; r < limit; ++r) {
      const char c = at(r);
      if (c == '"') {
        if (r == q) return Match::kNo;  // empty
        *value = std::string(span(q, r));
        *next = r + 1;
        return Match::kFull;
      }
      if (c == '<' || c == '>' || c == '\n') return Match::kNo;
    }
    if (limit - q > kMaxNameBytes) return Match::kNo;
    return eof_ ? Match::kNo : Match::kPartial;
  }
  // ws* ">" at p: kFull with *next after it.
  Match close_angle(size_t p, size_t* next) const {
    size_t q = p;
    while (q < end() && is_space(at(q))) ++q;
    if (q == end()) return eof_ ? Match::kNo : Match::kPartial;
    if (at(q) != '>') return Match::kNo;
    *next = q + 1;
    return Match::kFull;
  }
  // "<｜DSML｜invoke" or "<｜DSML｜parameter" followed by whitespace.
  Match open_tag(size_t p, const std::string& tag) const {
    const Match m = match(p, tag);
    if (m != Match::kFull) return m;
    if (p + tag.size() == end()) return eof_ ? Match::kNo : Match::kPartial;
    return is_space(at(p + tag.size())) ? Match::kFull : Match::kNo;
  }
  size_t skip_space(size_t p) const {
    while (p < end() && is_space(at(p))) ++p;
    return p;
  }

  // ---- states; each returns false when it needs more input ----
  bool step_reasoning() {
    const size_t q = buf_.find(kThinkClose, pos_ - base_);
    if (q != std::string::npos) {
      const size_t close = base_ + q;
      if (close > pos_) push(ChatDelta::Kind::kReasoning, span(pos_, close));
      pos_ = mark_ = close + kThinkClose.size();
      res.thinking_closed = true;
      raw_on_ = true;
      res.raw += span(pos_, end());
      state_ = State::kContent;
      return true;
    }
    const size_t stop = end() - held_tail(pos_, kThinkClose);
    if (stop > pos_) push(ChatDelta::Kind::kReasoning, span(pos_, stop));
    pos_ = mark_ = stop;
    return false;
  }

  bool step_content() {
    const size_t lt = buf_.find('<', pos_ - base_);
    const size_t q = lt == std::string::npos ? end() : base_ + lt;
    // Up to two newlines right before a tag belong to an envelope that may start there.
    size_t sep = q;
    while (sep > pos_ && q - sep < 2 && at(sep - 1) == '\n') --sep;
    if (lt == std::string::npos) {
      const size_t stop = eof_ ? end() : sep;
      content(pos_, stop);
      pos_ = mark_ = stop;
      return false;
    }
    Match best = Match::kNo;
    for (const std::string* wrap : {&kWrapOpenV32, &kWrapOpenV4}) {
      const Match m = match(q, *wrap);
      if (m == Match::kFull) {
        content(pos_, sep);
        mark_ = sep;
        pos_ = q + wrap->size();
        wrapped_ = true;
        wrap_close_ = "</" + wrap->substr(1);
        block_calls_ = 0;
        state_ = State::kBlock;
        return true;
      }
      if (m == Match::kPartial) best = m;
    }
    const Match m = open_tag(q, kInvokeOpen);
    if (m == Match::kFull) {
      content(pos_, sep);
      mark_ = sep;
      pos_ = q + kInvokeOpen.size();
      wrapped_ = false;
      block_calls_ = 0;
      state_ = State::kInvokeHead;
      return true;
    }
    if (m == Match::kPartial || best == Match::kPartial) {
      content(pos_, sep);
      pos_ = mark_ = sep;
      return false;
    }
    content(pos_, q + 1);
    pos_ = mark_ = q + 1;
    return true;
  }

  bool step_block() {
    const size_t p = skip_space(pos_);
    if (p == end() && !eof_) {
      pos_ = p;
      return false;
    }
    const Match inv = open_tag(p, kInvokeOpen);
    if (inv == Match::kFull) {
      pos_ = p + kInvokeOpen.size();
      state_ = State::kInvokeHead;
      return true;
    }
    const Match close = match(p, wrap_close_);
    if (close == Match::kFull && block_calls_ > 0) {
      pos_ = mark_ = p + wrap_close_.size();
      wrapped_ = false;
      state_ = State::kContent;
      return true;
    }
    if (inv == Match::kPartial || close == Match::kPartial) {
      pos_ = p;
      return false;
    }
    if (p == end() && block_calls_ > 0) {  // the text ended after complete calls
      content(mark_, end());
      pos_ = mark_ = end();
      state_ = State::kContent;
      return false;
    }
    fault(block_calls_ > 0 ? p : (close == Match::kFull ? p + wrap_close_.size() : p));
    return true;
  }

  bool step_invoke_head() {
    std::string name;
    size_t next = 0;
    Match m = attribute(pos_, "name", /*need_space=*/true, &name, &next);
    size_t after = 0;
    if (m == Match::kFull) m = close_angle(next, &after);
    if (m == Match::kPartial) return false;
    if (m == Match::kNo) {
      fault(pos_);
      return true;
    }
    begin_call(std::move(name));
    pos_ = mark_ = after;
    state_ = State::kInvokeBody;
    return true;
  }

  bool step_invoke_body() {
    const size_t p = skip_space(pos_);
    if (p == end() && !eof_) {
      pos_ = p;
      return false;
    }
    const Match param = open_tag(p, kParamOpen);
    if (param == Match::kFull) {
      param_start_ = p;
      pos_ = p + kParamOpen.size();
      state_ = State::kParamHead;
      return true;
    }
    const Match close = match(p, kInvokeClose);
    if (close == Match::kFull) {
      end_call(/*complete=*/true);
      pos_ = mark_ = p + kInvokeClose.size();
      state_ = wrapped_ ? State::kBlock : State::kContent;
      return true;
    }
    if (param == Match::kPartial || close == Match::kPartial) {
      pos_ = p;
      return false;
    }
    fault(p);
    return true;
  }

  bool step_param_head() {
    std::string name, kind;
    size_t next = 0, after_kind = 0, after = 0;
    Match m = attribute(pos_, "name", /*need_space=*/true, &name, &next);
    if (m == Match::kFull) m = attribute(next, "string", /*need_space=*/true, &kind, &after_kind);
    if (m == Match::kFull && kind != "true" && kind != "false") m = Match::kNo;
    if (m == Match::kFull) m = close_angle(after_kind, &after);
    if (m == Match::kFull && param_names_.count(name)) m = Match::kNo;  // duplicate
    if (m == Match::kPartial) return false;
    if (m == Match::kNo) {
      fault(param_start_);
      return true;
    }
    param_names_.insert(name);
    param_name_ = std::move(name);
    param_is_string_ = kind == "true";
    pos_ = after;
    if (param_is_string_) {
      param_prefix(param_name_);
      args("\"");
      mark_ = pos_;
      state_ = State::kStringValue;
    } else {
      value_start_ = pos_;
      state_ = State::kJsonValue;
    }
    return true;
  }

  // Finds "</｜DSML｜parameter>" from pos_: kFull with *close at its '<'; kPartial: pos_ is moved
  // to the earliest byte that may still start it; kNo: a stem not followed by '>' at *close.
  Match find_param_close(size_t* close) {
    const size_t q = buf_.find(kParamCloseStem, pos_ - base_);
    if (q == std::string::npos) {
      // At the end, a cut-off closing tag is not value text: the fault puts it in content.
      *close = end() - held_tail(pos_, kParamCloseStem + ">", /*even_at_end=*/true);
      return eof_ ? Match::kNo : Match::kPartial;
    }
    *close = base_ + q;
    const size_t gt = *close + kParamCloseStem.size();
    if (gt == end()) return eof_ ? Match::kNo : Match::kPartial;
    return at(gt) == '>' ? Match::kFull : Match::kNo;
  }

  bool step_string_value() {
    size_t close = 0;
    const Match m = find_param_close(&close);
    args_escaped(pos_, close);
    pos_ = mark_ = close;
    if (m == Match::kPartial) return false;
    if (m == Match::kNo) {
      fault(close);  // a stem without '>', or the text ended inside the value
      return true;
    }
    args("\"");
    pos_ = mark_ = close + kParamCloseStem.size() + 1;
    state_ = State::kInvokeBody;
    return true;
  }

  bool step_json_value() {
    size_t close = 0;
    const Match m = find_param_close(&close);
    if (m == Match::kPartial) {
      pos_ = close;
      return false;
    }
    const std::string_view value = span(value_start_, close);
    if (m == Match::kNo || !is_strict_json_value(value)) {
      fault(param_start_);
      return true;
    }
    param_prefix(param_name_);
    args(value);
    pos_ = mark_ = close + kParamCloseStem.size() + 1;
    state_ = State::kInvokeBody;
    return true;
  }

  bool step() {
    switch (state_) {
      case State::kReasoning:
        return step_reasoning();
      case State::kContent:
        return step_content();
      case State::kBlock:
        return step_block();
      case State::kInvokeHead:
        return step_invoke_head();
      case State::kInvokeBody:
        return step_invoke_body();
      case State::kParamHead:
        return step_param_head();
      case State::kStringValue:
        return step_string_value();
      case State::kJsonValue:
        return step_json_value();
    }
    return false;
  }

  // Drops the bytes no state can look at again.
  void compact() {
    size_t keep = std::min(pos_, mark_);
    if (state_ == State::kParamHead || state_ == State::kJsonValue) {
      keep = std::min(keep, param_start_);
    }
    const size_t drop = keep - base_;
    if (drop > 4096 && drop * 2 > buf_.size()) {
      buf_.erase(0, drop);
      base_ = keep;
    }
  }

  std::vector<ChatDelta> run() {
    // At the end of the text no state waits: each resolves (a fault, if open) and the loop ends
    // in kReasoning or kContent with everything emitted.
    while (step()) {
    }
    if (eof_)
      flush_carry();
    else
      hold_partial_character();
    compact();
    return std::exchange(out, {});
  }
};

ToolCallParser::ToolCallParser(ToolCallParserOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

std::vector<ChatDelta> ToolCallParser::feed(std::string_view chunk) {
  Impl& s = *impl_;
  if (s.eof_ || chunk.empty()) return {};
  if (s.raw_on_) s.res.raw += chunk;
  s.buf_ += chunk;
  return s.run();
}

std::vector<ChatDelta> ToolCallParser::finish() {
  Impl& s = *impl_;
  if (s.eof_) return {};
  s.eof_ = true;
  return s.run();
}

const ParsedCompletion& ToolCallParser::result() const { return impl_->res; }

ParsedCompletion parse_completion(std::string_view text, ToolCallParserOptions options) {
  ToolCallParser parser(std::move(options));
  parser.feed(text);
  parser.finish();
  return parser.result();
}

}  // namespace dsa::text
